"""Reading an engine's Prometheus ``/metrics``: snapshots and the deltas between two.

A profile's engine-side timings are differences of vLLM's histogram sums and counts
taken around one probe (``vllm:request_prefill_time_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:nixl_xfer_time_seconds``): the engine's
own clock, free of HTTP and client scheduling.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ampd.core.errors import AmpdError

PREFILL_TIME = "vllm:request_prefill_time_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
KV_XFER_TIME = "vllm:nixl_xfer_time_seconds"
KV_BYTES = "vllm:nixl_bytes_transferred"
CACHE_CONFIG = "vllm:cache_config_info"
# A mock engine's wall seconds per model second (``ampd.engines.mock.metrics``); vLLM has none.
TIME_SCALE = "ampd_mock_time_scale"


class ProbeError(AmpdError, RuntimeError):
    """An engine did not answer a probe as expected (the message names the engine and
    what was missing)."""


@dataclass(frozen=True)
class Snapshot:
    """One scrape of ``url``'s ``/metrics``.

    Attributes:
        values: every sample's value summed over label sets, by sample name
            (``<histogram>_sum``, ``<histogram>_count``, gauges, counters); a
            histogram's sum and count also per label set, by ``series(...)_sum``
            and ``series(...)_count``.
        labels: the label set of each ``*_info`` gauge, by metric name.
        buckets: each histogram's cumulative bucket counts by upper bound (seconds or
            units of the histogram; ``inf`` last), by histogram name.
    """

    url: str
    values: dict[str, float]
    labels: dict[str, dict[str, str]]
    buckets: dict[str, dict[float, float]]

    def value(self, name: str) -> float:
        """A sample's value; 0 for a histogram the engine has not created yet (vLLM
        creates the NIXL ones at the first transfer)."""
        return self.values.get(name, 0.0)


async def scrape(client: httpx.AsyncClient, url: str) -> Snapshot:
    """``GET url/metrics``, parsed.

    Raises:
        ProbeError: the engine is unreachable or answers with an error.
    """
    try:
        reply = await client.get(f"{url}/metrics")
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        raise ProbeError(f"{url}/metrics: {exc}") from None
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            for suffix in ("_sum", "_count"):
                if sample.labels and sample.name.endswith(suffix):
                    name = series(sample.name[:-len(suffix)], **sample.labels) + suffix
                    values[name] = values.get(name, 0.0) + sample.value
            if sample.name.endswith("_info"):
                labels[sample.name] = dict(sample.labels)
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                counts = buckets.setdefault(sample.name[:-len("_bucket")], {})
                counts[le] = counts.get(le, 0.0) + sample.value
    return Snapshot(url, values, labels, buckets)


def series(histogram: str, **labels: str) -> str:
    """The name under which a ``Snapshot`` holds one label set of ``histogram``
    (``delta(before, after, series(...))``)."""
    return histogram + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


def count_above(before: Snapshot, after: Snapshot, histogram: str, bound: float) -> float:
    """Observations ``histogram`` gained from ``before`` to ``after`` above ``bound``,
    which must be one of its bucket bounds."""
    def above(snapshot: Snapshot) -> float:
        counts = snapshot.buckets.get(histogram, {})
        return counts.get(math.inf, 0.0) - counts.get(bound, 0.0)
    return above(after) - above(before)


@dataclass(frozen=True)
class HistogramDelta:
    """Observations a histogram gained between two snapshots."""

    sum: float
    count: float

    @property
    def mean(self) -> float:
        """Mean of the new observations; NaN when there are none."""
        return self.sum / self.count if self.count else float("nan")


def delta(before: Snapshot, after: Snapshot, histogram: str) -> HistogramDelta:
    """What ``histogram`` gained from ``before`` to ``after``."""
    return HistogramDelta(after.value(f"{histogram}_sum") - before.value(f"{histogram}_sum"),
                          after.value(f"{histogram}_count") - before.value(f"{histogram}_count"))


async def settled(client: httpx.AsyncClient, befores: list[Snapshot], histogram: str, count: int,
                  timeout_s: float) -> list[Snapshot]:
    """Scrape every engine of ``befores`` until ``histogram`` has gained ``count``
    observations over them all; the new snapshots, in the same order.

    vLLM records a finished request's timings in the output loop, which may run just
    after the HTTP reply is out; polling waits for them rather than guessing a delay.

    Raises:
        ProbeError: more than ``count`` observations (another client is using the
            engine), or fewer after ``timeout_s`` seconds.
    """
    urls = ", ".join(b.url for b in befores)
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while True:
        afters = [await scrape(client, b.url) for b in befores]
        gained = sum(delta(b, a, histogram).count for b, a in zip(befores, afters))
        if gained == count:
            return afters
        if gained > count:
            raise ProbeError(f"{urls}: {histogram} gained {gained:g} observations, expected {count}: "
                             "another client is using the engine; profile an engine nobody else uses")
        if loop.time() > deadline_s:
            raise ProbeError(f"{urls}: {histogram} gained {gained:g} of {count} observations in "
                             f"{timeout_s:g} s: the engine does not report it")
        await asyncio.sleep(0.02)
