"""``queueing.fcfs_ttft_s``'s run as plain lists, to compare with values worked by hand."""


def listed(run):
    """(TTFTs, waited, local flags) of a ``QueueRun``, its arrays as lists."""
    return run.ttft_s.tolist(), run.waited, run.local.tolist()
