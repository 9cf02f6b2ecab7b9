"""Memory: how much there is, how a run shares it out, and who waits for it; one module a job.

- `planner`: the pure planner over plain numbers (budgets, chunk sizes, the host's share-out);
- `readings`: the device's and the host's memory read now (psutil, cgroups, torch), and the model's own bytes;
- `decode_peaks`: the measured host memory one item's decode will need, from its header;
- `decode_room`: the decode side's share of host memory, handed out to decode threads in input order;
- `allocator`: glibc's allocator settings for long CPU runs (flat peak memory, forwards without page faults).
"""
