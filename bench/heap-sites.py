"""Groups a heaptrack flamegraph (collapsed stacks, `heaptrack_print --print-flamegraph`)
by call site: the three nearest frames that are not the allocator's, a container's own
(push, insert, clone, collect...) or a closure's, so each line names the code that keeps
the memory. Prints MiB and bytes per registration, largest first.

    python3 bench/heap-sites.py live.txt N [LINES]
"""
import collections
import re
import sys

PLUMBING = re.compile(
    r"^(alloc|alloc_impl\w*|allocate\w*|finish_grow|grow\w*|with_capacity\w*|realloc|malloc|"
    r"exchange_malloc|new_uninit\w*|box_new\w*|try_allocate\w*|reserve\w*|do_reserve\w*|push\w*|"
    r"extend\w*|spec_extend|from_iter|collect|to_vec|to_owned|clone\w*|new|from|insert\w*|"
    r"call_once|call_mut|map|fold|for_each|try_fold|next|\{closure#\d+\}|into|copy_from_slice|"
    r"get_or_insert_with|entry|or_insert\w*|make_mut|from_elem|new_in|allocate_in|build|"
    r"serialize\w*|deserialize\w*|visit\w*|spec_from_iter\w*|from_iter_in_place|write\w*|do_call|"
    r"catch_unwind|poll\w*|with\w*|set|__rust\w*|_R\w*)(<.*>)?$"
)


def main():
    path, n = sys.argv[1], int(sys.argv[2])
    lines = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    sites = collections.Counter()
    for line in open(path):
        stack, cost = line.rstrip("\n").rsplit(" ", 1)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        kept = [f for f in frames if not PLUMBING.match(f.split(" (")[0])]
        sites[" < ".join(reversed(kept[-3:]))] += int(cost)
    total = sum(sites.values())
    for site, cost in sites.most_common(lines):
        print(f"{cost / 2**20:7.2f} MiB {cost / n:6.1f} B/reg  {site[:200]}")
    print(f"{total / 2**20:7.2f} MiB {total / n:6.1f} B/reg  live heap in all")


if __name__ == "__main__":
    main()
