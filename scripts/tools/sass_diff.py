"""Compare the device code of two builds kernel by kernel: the SASS of every kernel (by mangled name)
in the CUDA objects under OLD_DIR against those under NEW_DIR, ignoring instruction addresses and
column alignment. Exit 0 when every kernel is byte-identical. Needs cuobjdump on PATH (the CUDA
toolkit, or pip's nvidia-cuda-cuobjdump).

    python scripts/tools/sass_diff.py OLD_BUILD/CMakeFiles/fused_ops.dir NEW_BUILD/CMakeFiles/fused_ops.dir
"""
import pathlib
import re
import subprocess
import sys


def kernels(directory):
    """Mangled kernel name -> set of normalised SASS texts, over every *.cu.o under `directory`."""
    found = {}
    for path in sorted(pathlib.Path(directory).rglob("*.cu.o")):
        listing = subprocess.run(["cuobjdump", "-sass", str(path)], check=True, capture_output=True, text=True).stdout
        name, lines = None, []
        for line in listing.splitlines() + ["Function : <end>"]:
            match = re.match(r"\s*Function : (\S+)", line)
            if match:
                if name:
                    found.setdefault(name, set()).add("\n".join(lines))
                name, lines = match.group(1), []
            elif name:
                lines.append(" ".join(re.sub(r"/\*[0-9a-f]{4}\*/", "", line).split()))
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    only_old, only_new = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    differ = sorted(name for name in set(old) & set(new) if old[name] != new[name])
    print(f"kernels: {len(old)} before, {len(new)} after; identical: {len(set(old) & set(new)) - len(differ)}; "
          f"differ: {len(differ)}; only before: {len(only_old)}; only after: {len(only_new)}")
    for label, names in (("differs", differ), ("only before", only_old), ("only after", only_new)):
        for name in names:
            print(f"  {label}: {name}")
    sys.exit(1 if differ or only_old or only_new else 0)


if __name__ == "__main__":
    main()
