"""The fleet's learned pace against a simulated metered gateway: no processes, no
sockets, simulated time, so that a change of `domain/pacing.py`'s rules shows its
effect in seconds.

    .venv/bin/python bench/pace_sim.py [--seconds 120] [--seeds 3] [--threads 32]
                                       [--latency-ms 5] [--stray 0.03]
                                       [--configured 0.95] [--blip-at 20]

THREADS hop threads call as fast as the pace admits them (a call takes 5 ms, or
`--latency-ms`, and 10 ms pass before the thread's next); the gateway is a token
bucket of `rate` calls a second and a burst of 5 that answers 429 (`Retry-After`
the whole seconds to its next token) when it has none, and, in the stray rows,
answers a share of calls 429 at random whatever the rate. A throttled call's
thread waits its Retry-After; a held call asks again when the hold ends, and so
does a call whose wait a cut or a hold outlived (`still_admitted`), as a
worker's does. Rules as a worker's with no rate configured
(`PROVISIONER_GATEWAY_BURST` 1). Printed per gateway: calls answered over the
seeds against rate x seconds (`x floor`: the time the same calls would take at
the gateway's rate, over the simulated time) and the share answered 429. The "no
limit" row has only the stray 429s; its floor is the calls answered with a
configured rate too high ever to bind (so 1.00: stray 429s cost the fleet
nothing). An answered call is published to the state at once (a worker publishes
it with its next write). `--configured X` configures the rate as X times the
gateway's (`PROVISIONER_GATEWAY_RATE`; the "no limit" row is then left out), and
`--blip-at S` has the gateway answer every call 429 for 2 s from S (a quota
another client shared for a moment): with both, what a configured rate keeps of
its rate after a cut, under the stray rows' share (`--stray`).
The real rollout (`bench/rollout.py metered`) measures the same on the service.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from domain.pacing import (
    Hold,
    PaceRules,
    PaceState,
    Result,
    admit,
    count_answered,
    observe,
    still_admitted,
)

CALL_S, THINK_S = 0.005, 0.010


def simulate(
    rules: PaceRules,
    rate: float | None,
    seconds: float,
    threads: int,
    stray: float,
    seed: int,
    retry_after: float = 0.0,
    call_s: float = CALL_S,
    blip_at: float | None = None,
    burst: float = 5.0,
    jitter_s: float = 0.0,
) -> tuple[int, int]:
    """(calls answered, calls answered 429) in `seconds` of simulated time; `rate`
    None: no limit, only the stray 429s."""
    draw = random.Random(seed)
    state, start = PaceState(), 1000.0
    tokens, tokens_at = burst, 0.0
    events = [(draw.random() * 0.05, "ask", n) for n in range(threads)]
    admitted: dict[int, PaceState] = {}  # the state each waiting call was admitted on
    again: set[int] = set()  # the calls asking again (counted at their first admission)
    answered = throttled = 0
    while events:
        t, kind, n = heapq.heappop(events)
        if t > seconds:
            continue
        if kind == "ask":
            state, decision = admit(rules, state, start + t, again=n in again)
            again.discard(n)
            if isinstance(decision, Hold):
                heapq.heappush(events, (t + max(decision.wait_s, 0.01), "ask", n))
            else:
                admitted[n] = state
                heapq.heappush(events, (t + decision.wait_s, "send", n))
            continue
        if kind == "send":
            if not still_admitted(admitted.pop(n), state, start + t):
                again.add(n)
                heapq.heappush(events, (t, "ask", n))  # a cut or a hold since: ask again
            else:  # on its way: it reaches the gateway up to `jitter_s` later
                heapq.heappush(events, (t + draw.random() * jitter_s, "arrive", n))
            continue
        if rate is not None:
            tokens, tokens_at = min(burst, tokens + (t - tokens_at) * rate), t
        blip = blip_at is not None and blip_at <= t < blip_at + 2.0
        if tokens >= 1 and not blip and not draw.random() < stray:
            tokens -= 1 if rate is not None else 0
            answered += 1
            state, _ = observe(rules, state, start + t + call_s, Result.ANSWERED)
            state = count_answered(state, start + t + call_s, 1)
            heapq.heappush(events, (t + call_s + THINK_S, "ask", n))
        else:
            throttled += 1
            told = max(1, math.ceil((1 - tokens) / rate)) if rate is not None else 1
            told = max(told, retry_after)
            state, _ = observe(
                rules, state, start + t + call_s, Result.THROTTLED, retry_after_s=told
            )
            heapq.heappush(events, (t + call_s + told, "ask", n))
    return answered, throttled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument(
        "--retry-after", type=float, default=0.0, help="every 429 asks at least this many s"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=CALL_S * 1000, help="each call's time to answer"
    )
    parser.add_argument("--stray", type=float, default=0.03, help="the stray rows' share")
    parser.add_argument("--configured", type=float, help="the rate configured, times the gateway's")
    parser.add_argument("--blip-at", type=float, help="every call 429 for 2 s from then")
    parser.add_argument("--burst", type=float, default=5.0, help="the gateway's bucket (1: strict)")
    parser.add_argument(
        "--jitter-ms", type=float, default=0.0, help="each call reaches the gateway up to this late"
    )
    args = parser.parse_args()
    call_s = args.latency_ms / 1000
    rules = PaceRules(burst=1, probe_every_s=10.0, retry_after_max_s=300.0)
    print("| gateway | stray 429s | x floor | answered 429 |")
    print("|---|---|---|---|")
    unpaced = None  # no limit: the floor is what the threads send with no pace at all
    for rate, stray in (
        (10.0, 0.0), (20.0, 0.0), (50.0, 0.0), (20.0, args.stray), (50.0, args.stray),
        (None, args.stray),
    ):  # fmt: skip
        if rate is None and args.configured is not None:
            continue
        if rate is not None and args.configured is not None:
            rules = replace(rules, rate=rate * args.configured)
        answered = throttled = 0
        for seed in range(args.seeds):
            a, t = simulate(
                rules, rate, args.seconds, args.threads, stray, seed, args.retry_after, call_s,
                args.blip_at, args.burst, args.jitter_ms / 1000,
            )  # fmt: skip
            answered, throttled = answered + a, throttled + t
        if rate is None:
            if unpaced is None:
                unpaced = sum(
                    simulate(PaceRules(rate=1e9, burst=1, probe_every_s=10.0,
                                       retry_after_max_s=300.0),
                             None, args.seconds, args.threads, stray, seed, 0.0, call_s,
                             None, args.burst, args.jitter_ms / 1000)[0]
                    for seed in range(args.seeds)
                )  # fmt: skip
            floor, gateway = float(unpaced), "no limit"
        else:
            floor, gateway = rate * args.seconds * args.seeds * (1 - stray), f"{rate:g} calls/s"
        print(f"| {gateway} | {stray:.0%} | {floor / answered:.2f} | "
              f"{throttled / (answered + throttled):.1%} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
