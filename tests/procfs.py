"""Reading a live process tree from /proc, where threads and processes may end mid-read."""
from pathlib import Path


def children_of(pid: int) -> set[int]:
    """`pid`'s children; a thread or process that ends while /proc is read is skipped."""
    found: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.update(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found
