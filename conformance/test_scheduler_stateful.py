"""Stateful Hypothesis model of a continuous-batching scheduler and its KV cache, driven without a model.

A drawn configuration (block size, device / host blocks, token budget, max_num_seqs, chunked prefill, long-prefill
threshold, prefix caching, policy, priority preemption, batching mode, preemption mode, async scheduling), then
random interleavings of three rules: add a request (prompts share prefixes from a small pool, so that prefix
caching hits), step (schedule + FakeRunner + update) and abort. Every step is checked against the named
invariants of conformance/invariants/ and the engine's own check_invariants(); teardown drains every request
and checks liveness and leaks. With async scheduling on, a step's output is fed after the next step's schedule(),
as vLLM's engine core does.

The machine talks to the scheduler only through a SchedulerAdapter (`--engine`), so any engine with an adapter runs
it; test_suite_bites.py runs it against deliberately broken schedulers.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from hypothesis import assume, event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from conformance import invariants as inv
from conformance.adapters import (
    CHECKED_PROPERTY,
    DEPARTED_PROPERTY,
    NOT_DRAWN_PROPERTY,
    REFUSED_PROPERTY,
    STALLED_PROPERTY,
)
from conformance.fake_runner import EOS_TOKEN_ID, FakeRunner, RequestSpec
from conformance.invariants.scope import checked_each_step
from conformance.progress import guarded

BATCHING_MODES = ("continuous", "sequence", "static", "none")
MAX_REQUESTS = 10  # per example: keeps the teardown drain (and the liveness bound) small
PROGRESS_WINDOW = 2  # steps in a row that may schedule nothing while requests are unfinished (see check_progress)
# Prompts are a prefix of one of these (so that prompts share full blocks) plus a short private tail.
PREFIX_POOL = [[100 + 7 * j + i for i in range(48)] for j in range(3)]
STOP_TOKEN_ID = 7


# The values the machine draws each discrete knob from (an adapter's `knob_domain` narrows them)
KNOB_CHOICES: dict[str, tuple] = {
    "block_size": (1, 2, 4, 8, 16),
    "enable_chunked_prefill": (True, False),
    "long_prefill_token_threshold": (0, 1),  # 0 or 1..16
    "enable_prefix_caching": (True, False),
    "policy": ("fcfs", "priority"),
    "priority_preemption": (False, True),
    "preemption_mode": ("recompute", "swap"),
    "async_scheduling": (False, True),
}


@st.composite
def scheduler_configs(
    draw, modes: tuple[str, ...] = BATCHING_MODES, pressure: bool = False, domain: dict[str, tuple] | None = None
) -> dict:
    """A scheduler configuration; `pressure` draws small blocks and tight device pools, so that most examples
    preempt (and, with a roomy host pool, swap). `domain` (an adapter's knob_domain) limits a knob to the values an
    engine can run, so that its examples are not mostly drawn and refused."""
    domain = domain or {}

    def knob(name: str, strategy: st.SearchStrategy) -> object:
        return draw(st.sampled_from(domain[name])) if name in domain else draw(strategy)

    def within(name: str, values: list) -> list:
        return [v for v in values if v in domain[name]] if name in domain else values

    chunked = knob("enable_chunked_prefill", st.booleans())
    policy = knob("policy", st.sampled_from(["fcfs", "priority"]))
    if pressure:
        block_size = draw(st.sampled_from(within("block_size", [1, 2, 4])))
        num_gpu_blocks = draw(st.integers(3, 10))
        num_cpu_blocks = draw(st.one_of(st.integers(0, 3), st.integers(8, 32)))
    else:
        block_size = draw(st.sampled_from(within("block_size", [1, 2, 4, 8, 16])))
        num_gpu_blocks = draw(st.one_of(st.integers(2, 12), st.integers(13, 40)))
        num_cpu_blocks = draw(st.one_of(st.integers(0, 4), st.integers(5, 32)))
    return dict(
        batching=draw(st.sampled_from(modes)),
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        # often small, so that prompts are chunked and steps are budget-bound
        max_num_batched_tokens=draw(st.one_of(st.integers(1 if chunked else 2, 8), st.integers(9, 64))),
        max_num_seqs=draw(st.integers(1, 8)),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=knob("long_prefill_token_threshold", st.one_of(st.just(0), st.integers(1, 16))),
        enable_prefix_caching=knob("enable_prefix_caching", st.booleans()),
        policy=policy,
        priority_preemption=knob("priority_preemption", st.booleans()) if policy == "priority" else False,
        preemption_mode=knob("preemption_mode", st.sampled_from(["recompute", "swap"])),
        async_scheduling=knob("async_scheduling", st.booleans()),
    )


def not_drawn(adapter_cls) -> dict[str, str]:
    """What an adapter's knob_domain leaves out of the machine's draws, as {reason: knob}: the engine's supports()
    reason for the first value left out of each knob."""
    domain = getattr(adapter_cls, "knob_domain", {})
    supports = getattr(adapter_cls, "supports", None)
    out = {}
    for name, allowed in domain.items():
        left_out = [v for v in KNOB_CHOICES[name] if v not in allowed]
        why = supports({name: left_out[0]}) if left_out and supports is not None else None
        if why is not None:
            out[why] = f"{name} in {tuple(allowed)}"
    return out


class SchedulerMachine(RuleBasedStateMachine):
    adapter_cls = None  # set by make_machine()
    refused: Counter[str] = Counter()  # drawn configurations the engine's supports() refused, by reason (make_machine)
    departed: Counter[str] = Counter()  # checks of the adapter's declared departures that failed, by invariant
    stalled: Counter[str] = Counter()  # examples ended in a state the engine is known never to leave, by reason
    checked: Counter[str] = Counter()  # checks run, by invariant (those that apply to the drawn configuration)
    batching_modes: tuple[str, ...] = BATCHING_MODES
    pressure = False

    def __init__(self) -> None:
        super().__init__()
        self.adapter = None
        self.failed = False

    # ---- rules ----------------------------------------------------------------------------------------------------
    # One seed for the fake runner and the prompt tails rather than a Hypothesis-driven Random: every token drawn
    # from the example's data made shrinking take minutes; a seed shrinks at once and the rule sequence still does.
    @initialize(data=st.data(), seed=st.integers(0, 2**16), eos_prob=st.sampled_from([0.0, 0.02, 0.2]))
    def setup(self, data, seed, eos_prob) -> None:
        domain = getattr(self.adapter_cls, "knob_domain", None)
        cfg = data.draw(scheduler_configs(self.batching_modes, self.pressure, domain), label="config")
        if self.pressure:
            eos_prob = min(eos_prob, 0.02)  # long generations grow the KV until something must give
        supports = getattr(self.adapter_cls, "supports", None)
        why = supports(cfg) if supports is not None else None
        if why is not None:  # reported by the test (the values in a reason are the draw's, not part of it)
            self.refused[re.sub(r"\(\d+\)", "(N)", why)] += 1
        assume(why is None)
        self.cfg = cfg
        self.adapter = self.adapter_cls(eos_token_id=EOS_TOKEN_ID, **cfg)
        # invariants this engine departs from by design, each with its reason (SchedulerAdapter.departures): their
        # violations are counted and reported, every other invariant still fails the example
        self.departures = frozenset(getattr(self.adapter_cls, "departures", {}))
        unchecked = getattr(self.adapter_cls, "unchecked", {})  # what the adapter cannot report, with why
        self._applicable = [name for name in checked_each_step(cfg) if name not in unchecked]
        self.rng = rng = random.Random(seed)
        self.runner = FakeRunner(rng, eos_prob)
        self.specs: dict[str, RequestSpec] = {}
        self.finished: set[str] = set()
        self.clock = 0.0
        self.pending: tuple[dict, dict] | None = None  # async: the last step's (sampled tokens, their indexes)
        self.idle_steps = 0
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_swaps = 0
        self.stall: str | None = None  # the engine's known bug this example ran into (SchedulerAdapter.stalled)

    @precondition(lambda self: self.adapter is not None and len(self.specs) < MAX_REQUESTS)
    @rule(
        pool=st.integers(0, len(PREFIX_POOL) - 1),
        prefix_len=st.integers(0, 40),
        tail_len=st.integers(0, 10),
        max_tokens=st.integers(1, 16),
        min_tokens=st.integers(0, 3),
        priority=st.integers(0, 3),
        ignore_eos=st.booleans(),
        use_stop=st.booleans(),
        tie=st.booleans(),
    )
    def add_request(
        self, pool, prefix_len, tail_len, max_tokens, min_tokens, priority, ignore_eos, use_stop, tie
    ) -> None:
        if self.stall:
            return
        c = self.cfg
        prompt = PREFIX_POOL[pool][:prefix_len] + [self.rng.randrange(1000, 2000) for _ in range(tail_len)]
        prompt = prompt or [self.rng.randrange(1000, 2000)]
        # Only requests that fit alone (the engine rejects the others at its API): prompt + max_tokens - 1 tokens of
        # KV fit the device, and without chunked prefill prompt + max_tokens (a recompute re-prefill) fit the budget.
        kv_cap = c["num_gpu_blocks"] * c["block_size"]
        prompt = prompt[: kv_cap if c["enable_chunked_prefill"] else min(kv_cap, c["max_num_batched_tokens"] - 1)]
        if self.pressure:  # short prompts, long generations: several requests get in, then outgrow the pool
            prompt = prompt[: max(1, kv_cap // 3)]
            max_tokens = max(max_tokens, kv_cap // 2)
        max_tokens = min(max_tokens, kv_cap - len(prompt) + 1)
        if not c["enable_chunked_prefill"]:
            max_tokens = min(max_tokens, c["max_num_batched_tokens"] - len(prompt))
        if not tie:  # else the same arrival_time as the previous request: priority ties fall to the request id
            self.clock += 1.0
        rid = f"r{len(self.specs)}"
        spec = RequestSpec(
            prompt,
            max_tokens,
            min(min_tokens, max_tokens),
            ignore_eos,
            [STOP_TOKEN_ID] if use_stop else [],
            priority,
            self.clock,
        )
        self.specs[rid] = spec
        self.adapter.add_request(
            rid,
            prompt,
            max_tokens=spec.max_tokens,
            priority=priority,
            arrival_time=self.clock,
            min_tokens=spec.min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=spec.stop_token_ids or None,
        )

    @precondition(lambda self: self.adapter is not None)
    @rule()
    def step(self) -> None:
        self._step()

    @precondition(lambda self: self.adapter is not None)
    @rule(k=st.integers(2, 6))
    def step_several(self, k) -> None:
        """Several steps at once, so that requests reach their decode phase between arrivals."""
        for _ in range(k):
            self._step()

    @precondition(lambda self: self.adapter is not None and len(self.finished) < len(self.specs))
    @rule(pick=st.integers(0, MAX_REQUESTS))
    def abort(self, pick) -> None:
        if self.stall:
            return
        live = [rid for rid in self.specs if rid not in self.finished]
        rid = live[pick % len(live)]
        self.failed = True  # until the checks below pass
        self.adapter.abort([rid])
        self.finished.add(rid)
        snap = inv.snapshot(self.adapter)
        self._check(inv.check_aborted, self.adapter.request(rid), snap)
        self.checked["aborted"] += 1
        inv.check_state(
            self.cfg, snap, self._tokens(), self.adapter.num_gpu_blocks, departures=self.departures, seen=self.departed
        )
        self.adapter.check_invariants()
        self.failed = False
        self._note_stall()

    # ---- one engine step ------------------------------------------------------------------------------------------
    def _check(self, check, *args) -> None:
        inv.run_check(check, *args, departures=self.departures, seen=self.departed)

    def _tokens(self) -> dict[str, list[int]]:
        return {rid: s.all_token_ids for rid, s in self.specs.items()}

    def _note_stall(self) -> None:
        """An engine may name a state it is known never to leave (its bug, shown on a named case): the example ends
        there, counted and reported, instead of failing `progress` or liveness on it. Everything before was checked."""
        stalled = getattr(self.adapter, "stalled", None)
        why = stalled() if stalled is not None else None
        if why is not None and self.stall is None:
            self.stall = why
            self.stalled[why] += 1
            event("known stall of the engine")

    def _step(self) -> None:
        if self.stall:
            return
        try:
            self._checked_step()
        except BaseException:
            self.failed = True  # teardown must not drain a broken state and mask the first failure
            raise

    def _checked_step(self) -> None:
        a, cfg = self.adapter, self.cfg
        before = inv.snapshot(a)
        step = a.schedule()
        self.num_steps += 1
        self._note_stall()  # a step the engine crashed in (a known bug) leaves no state to check
        if self.stall:
            self.pending = None
            return
        after = inv.snapshot(a)
        inv.check_step(cfg, before, step, after, departures=self.departures, seen=self.departed)
        inv.check_state(cfg, after, self._tokens(), a.num_gpu_blocks, departures=self.departures, seen=self.departed)
        self._note_coverage(before, step, after)

        sampled = self.runner.sample(step, after.by_id, self.specs)
        index = {rid: after.by_id[rid].sample_index for rid, toks in sampled.items() if toks}
        now = (sampled, index)
        to_feed, self.pending = (self.pending, now) if cfg["async_scheduling"] else (now, None)
        if to_feed is not None:
            to_feed, index = to_feed
            # a request that finished (or was aborted) since that step was scheduled drops its output
            live = {rid: toks for rid, toks in to_feed.items() if rid not in self.finished}
            for rid, toks in live.items():
                if toks:
                    self._check(inv.check_sample_position, rid, index[rid], len(self.specs[rid].output_token_ids))
                    self.checked["sample_position"] += 1
                self.specs[rid].output_token_ids.extend(toks)
            finished = set(a.update(to_feed))
            for rid, toks in live.items():
                if toks:
                    self._check(inv.check_finish, a.request(rid), self.specs[rid].expected_finish(), rid in finished)
                    self.checked["finish"] += 1
            self.finished |= finished

        rest = inv.snapshot(a)
        inv.check_state(cfg, rest, self._tokens(), a.num_gpu_blocks, departures=self.departures, seen=self.departed)
        self._check(
            inv.check_outputs_kept,
            {rid: a.request(rid) for rid in self.specs},
            {rid: len(s.output_token_ids) for rid, s in self.specs.items()},
            {rid: len(s.prompt_token_ids) for rid, s in self.specs.items()},
        )
        a.check_invariants()
        self.checked.update(name for name in self._applicable if name not in self.departures)
        self._note_stall()
        if self.stall:
            return
        busy = bool(step.num_scheduled_tokens or step.preempted_req_ids)
        self.idle_steps = 0 if busy or not (rest.running or rest.waiting) else self.idle_steps + 1
        self._check(inv.check_progress, self.idle_steps, PROGRESS_WINDOW, rest)

    def _note_coverage(self, before: inv.Snapshot, step, after: inv.Snapshot) -> None:
        """Hypothesis `event`s, so that `--hypothesis-show-statistics` shows which paths the examples reached."""
        if step.preempted_req_ids:
            event("preemption")
            self.num_preemptions += len(step.preempted_req_ids)
        if step.blocks_to_swap_out:
            event("swap out")
            self.num_swaps += 1
        if step.blocks_to_swap_in:
            event("swap in")
        for rid in inv.admitted_ids(before, after):
            if (
                after.by_id[rid].num_computed_tokens - step.num_scheduled_tokens.get(rid, 0)
                > before.by_id[rid].num_computed_tokens
            ):
                event("prefix-cache hit")
        if len(after.running) > 1 and len(step.num_scheduled_tokens) > 1:
            event("batched step")
        if any(v.num_output_placeholders for v in after.running):
            event("async: output placeholders")
        if self.pending and any(self.pending[0].get(rid) for rid in step.preempted_req_ids):
            event("async: preempted with its output in flight")

    def teardown(self) -> None:
        if self.adapter is None or self.failed or self.stall:
            return
        pending = [(len(s.prompt_token_ids), s.max_tokens) for rid, s in self.specs.items() if rid not in self.finished]
        bound = inv.liveness_bound(pending)
        steps = 0
        while len(self.finished) < len(self.specs):
            steps += 1
            if steps > bound:
                snap = inv.snapshot(self.adapter)
                inv._fail(
                    "liveness",
                    f"{len(self.specs) - len(self.finished)} requests unfinished after {bound} steps of draining",
                    cfg=self.cfg,
                    snaps=[("state", snap)],
                )
            self._step()
            if self.stall:  # the drain ran into the engine's known bug: nothing more to check
                return
        self._check(inv.check_all_finished, [self.adapter.request(rid) for rid in self.specs])
        target(float(self.num_preemptions), label="preemptions")  # steer generation towards KV pressure
        target(float(self.num_swaps), label="swaps")
        self._check(inv.check_no_leaks, inv.snapshot(self.adapter), self.adapter.num_gpu_blocks)
        self.checked.update(("liveness", "all_finished", "no_leaks"))


def make_machine(
    adapter_cls, modes: tuple[str, ...] = BATCHING_MODES, pressure: bool = False
) -> type[SchedulerMachine]:
    return type(
        f"SchedulerMachine_{adapter_cls.__name__}",
        (SchedulerMachine,),
        {
            # every step under the progress guard (conformance/progress.py): a livelock or a loop inside a step
            # fails the example with the stuck state, within a few steps or seconds, instead of running on
            "adapter_cls": guarded(adapter_cls),
            "batching_modes": tuple(modes),
            "pressure": pressure,
            "refused": Counter(),
            "departed": Counter(),
            "stalled": Counter(),
            "checked": Counter(),
        },
    )


@pytest.mark.parametrize(
    "batching, pressure",
    [("continuous", False), ("continuous", True), ("sequence", False), ("static", False), ("none", False)],
    ids=["continuous", "continuous-kv-pressure", "sequence", "static", "none"],
)
def test_scheduler_invariants(request, adapter_cls, batching, pressure):
    supports = getattr(adapter_cls, "supports", None)
    if supports is not None and supports({"batching": batching}) is not None:
        pytest.skip(supports({"batching": batching}))
    machine = make_machine(adapter_cls, (batching,), pressure)
    try:
        # settings() built here inherits the profile conftest.py loaded (ci / thorough)
        run_state_machine_as_test(machine, settings=settings())
    finally:
        request.node.user_properties.append((REFUSED_PROPERTY, dict(machine.refused)))
        request.node.user_properties.append((DEPARTED_PROPERTY, dict(machine.departed)))
        request.node.user_properties.append((STALLED_PROPERTY, dict(machine.stalled)))
        request.node.user_properties.append((NOT_DRAWN_PROPERTY, not_drawn(adapter_cls)))
        request.node.user_properties.append((CHECKED_PROPERTY, dict(machine.checked)))
