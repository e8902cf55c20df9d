"""Engine: the continuous-batching step loop over a worker and the scheduler; requests, stats.

``generate`` and ``stream`` run in app/engine/generation.py over ``submit`` and ``step``; a
scheduled plan's step is launched and read back in app/engine/pipeline.py; the prompts' encoding
and checks are in app/engine/prompts.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Generator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from eagletree.app.engine import generation
from eagletree.app.engine.commit import count_step
from eagletree.app.engine.pipeline import StepPipeline
from eagletree.app.engine.prompts import Prompt, check_prompt_ids, encode_prompt
from eagletree.app.engine.reports import EngineStats, GenerationResult, StepReport
from eagletree.app.engine.scheduler import PrefillStep, Scheduler
from eagletree.domain.request import Request
from eagletree.domain.sampling import SamplingParams

if TYPE_CHECKING:
    from eagletree.app.engine.phases import PhaseAgreement
    from eagletree.app.engine.streaming import StreamEvent
    from eagletree.app.engine.worker import Worker
    from eagletree.ports.memory import ReqToTokenPool, TokenSlotAllocator
    from eagletree.ports.tokenizer import Tokenizer


class Engine:
    """Generates for many requests at once: new requests prefill while running ones decode.

    ``tokenizer`` (the checkpoint's, set by ``build_engine``) lets prompts be text and
    results carry text. Use as a context manager, or call ``close``, to abort what is left.

    With ``overlap`` the engine keeps one step in flight: ``step`` launches step i + 1 before it
    reads step i's tokens (``StepPipeline``); outputs are those of the synchronous loop.

    ``prefill_step``: where a plan's prefills run, beside its decode batch (``"with_decode"``)
    or in a step of their own while the running requests wait one step (``"alone"``).

    ``phases``: a data-parallel rank whose dense layers are shared with its group agrees on
    each launched step's phases with the group (``PhaseAgreement``), so that every rank runs
    the same forwards; each rank then launches its steps only together with the others
    (``step(run_idle=True)`` in lockstep).
    """

    tokenizer: Tokenizer | None = None
    _closed: bool = False

    def __init__(
        self,
        worker: Worker,
        allocator: TokenSlotAllocator,
        req_to_token_pool: ReqToTokenPool,
        *,
        vocab_size: int,
        max_context_len: int,
        max_running_requests: int,
        eos_token_ids: Collection[int] = (),
        max_prefill_tokens: int = 16_384,
        clock: Callable[[], float] = time.perf_counter,
        overlap: bool = False,
        prefill_step: PrefillStep = "with_decode",
        phases: PhaseAgreement | None = None,
    ) -> None:
        self.worker = worker
        self._phases = phases
        self._scheduler = Scheduler(
            allocator,
            req_to_token_pool,
            max_running_requests=max_running_requests,
            reserve_per_step=worker.reserve_per_step,
            grow_ahead=worker.grow_ahead,
            max_prefill_tokens=max_prefill_tokens,
            prefill_step=prefill_step,
            clock=clock,
        )
        self._steps = StepPipeline(worker, self._scheduler, clock, overlap=overlap)
        self.vocab_size = vocab_size
        self.max_context_len = max_context_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self._clock = clock
        self._next_request_id = 0
        self.stats = EngineStats()

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def overlap(self) -> bool:
        return self._steps.overlap

    # -- requests ------------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        """Queue one request (validated as ``generate`` does); returns its live state."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        request_id = self._next_request_id
        self.check_prompt(request_id, prompt_ids, params.max_new_tokens)
        request = Request(request_id, prompt_ids, params, self.max_context_len, self._clock())
        self._scheduler.add(request)
        self._next_request_id += 1
        return request

    def abort(self, request_id: int) -> bool:
        """Abort a queued or running request; it finishes with ABORT at the next step."""
        return self._scheduler.abort(request_id)

    def has_work(self) -> bool:
        return self._scheduler.has_work()

    # -- the step ------------------------------------------------------------------------------

    def step(self, *, run_idle: bool = False) -> list[Request]:
        """One iteration: schedule, launch the worker's step, commit the tokens of the step
        launched before it (this one's, without overlap), release what finished.

        ``run_idle``: with nothing scheduled, still run the worker's idle step (bs == 0) through
        every phase, as a data-parallel rank does while its group steps."""
        started = self._clock()
        finished = self._steps.read_first(self.eos_token_ids, self.stats)
        plan = self._scheduler.schedule()
        # a retraction frees a row the step in flight still reports on: decided after reading it
        in_flight = self._steps.has_step_in_flight
        assert not (in_flight and plan.retracted), "retracted with a step in flight"
        self.stats.num_prefill_tokens += sum(r.num_tokens for r in plan.prefill)
        launch = None
        if not plan.is_empty or run_idle:
            self.stats.num_idle_steps += plan.is_empty
            if self._phases is not None:
                plan = dataclasses.replace(plan, group_phases=self._phases.agree(plan))
            launch = plan
        finished += self._steps.advance(launch, self.eos_token_ids, self.stats)
        finished = plan.released + finished
        count_step(self.stats, plan, finished, started, self._clock)
        return finished

    # -- generate ------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token_ids: Collection[int] | None = None,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt; results in prompt order.

        A prompt is a sequence of token ids or a text (encoded by ``tokenizer``). Greedy when
        ``temperature`` is 0. With ``seed`` request i samples with seed ``seed + i``, so its
        output does not depend on the other prompts of the call. A request stops at an EOS
        token of the model, one of ``stop_token_ids`` (both kept in the output),
        ``max_new_tokens``, or the context length. Raises ValueError naming the first bad
        request before anything is queued.
        """
        batch = generation.PromptBatch(
            prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids
        )
        return generation.generate(self, batch, on_step)

    def stream(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token_ids: Collection[int] | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """As ``generate``, yielding each request's new tokens (and text) as steps commit them.

        The last event of a request has ``finish_reason`` and ``result`` set. Closing the
        iterator early aborts the requests still running and frees their slots.
        """
        batch = generation.PromptBatch(
            prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids
        )
        return generation.stream(self, batch)

    def warm_up(self) -> int:
        """Prefill one request of each length in ``warm_up_lengths`` greedily, and one sampled,
        a token each, then forget their statistics: a prefill's Triton kernels compile on
        their first call for each tile size and integer specialisation they meet, and
        CUDA-graph capture runs only the decode steps' (on a fresh H200 a first request of 64
        tokens compiled its attention and GEMM tiles for 1.3 s; once compiled it took 0.07).
        Every request finishes; nothing stays allocated; a length the pools could not hold
        is left out. Returns how many lengths it prefilled."""
        problem = self._scheduler.capacity_problem  # a small pool holds only the shorter ones
        longest = self.max_context_len - 1
        lengths = [n for n in warm_up_lengths(longest) if problem(n + 1) is None]
        for size in lengths:
            self.generate([[0] * size], max_new_tokens=1, seed=0)
        if lengths:  # the sampler's kernels, for a prompt of any length
            self.generate([[0] * lengths[-1]], max_new_tokens=1, temperature=1.0, seed=0)
        self.stats = EngineStats()
        return len(lengths)

    def result_of(self, request: Request) -> GenerationResult:
        """The result of a finished request, with its text when the engine has a tokenizer."""
        result = GenerationResult.of(request)
        if self.tokenizer is None:
            return result
        return dataclasses.replace(result, text=self.tokenizer.decode(result.output_ids))

    def close(self) -> None:
        """Abort every queued or running request and free its slots; later submits fail."""
        unfinished = [*self._scheduler.running, *self._scheduler.waiting]
        generation.abort_and_release(self, unfinished)
        self._steps.read(self.eos_token_ids, self.stats)  # in flight: its tokens are dropped
        self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Token ids of a prompt; text needs the tokenizer (ValueError naming the request)."""
        return encode_prompt(prompt, self.tokenizer, index)

    def check_prompt(self, index: int, prompt: Sequence[int], max_new_tokens: int) -> None:
        """Raise the ValueError (naming request ``index``) with which ``submit`` would refuse
        the prompt; nothing is queued."""
        check_prompt_ids(
            index,
            prompt,
            max_new_tokens,
            vocab_size=self.vocab_size,
            max_context_len=self.max_context_len,
            scheduler=self._scheduler,
        )


def warm_up_lengths(longest: int) -> list[int]:
    """The prompt lengths, at most ``longest``, whose prefills meet every kernel variant a
    prompt up to 256 tokens compiles: a prefill's GEMM and attention tiles are the next power
    of two of its rows (times the query heads a key head serves), and Triton compiles an
    integer argument apart when it is 1 or divisible by 16, so each power of two p from 2
    to 256 and p − 1 (the same tile, another remainder); a longer prompt reuses the 256-row
    tiles."""
    powers = [1 << k for k in range(1, 9)]
    wanted = {1, *powers, *(p - 1 for p in powers)}
    return sorted(n for n in wanted if n <= longest)
