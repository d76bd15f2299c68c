"""Several searches decoded together: one model call per decoding step for all of them.

A search here is a coroutine (`nmt.search.Steps`): it yields `(tokens, state)` whenever it needs
a decoding step and takes the step's logits back, and in the end returns its result
(`nmt.search.beam_steps`, `NativeEngine.search_steps`, `Translator.steps`). `JointSteps` keeps
the searches under way and advances all of them by one step with a single
`model.decode_steps` call. A search can join at any step, so a server need not wait for the
longest sentence of a batch before it starts the next requests.

Why: the step of a small batch is mostly fixed cost. On a CPU its linear layers read all of the
decoder's weights once per call (15 MB in fp32 for configs/small.yaml) whatever the number of
rows, so two searches of 8 sentences in one call cost little more than one. Attention and the
KV caches stay per search, each at its own position, so no row is padded to another search's
length (the cost that made joining sentences into one search slower than batching requests;
docs/BENCHMARKS.md, "Serving under load"). The results are those of each search run alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.search import Steps

Finished = Callable[[Any, BaseException | None], None]  # (result, None) or (None, the error raised)


@dataclass
class _Running:
    search: Steps[Any]
    tokens: Tensor  # (R,) the step it asked for
    state: Any
    finished: Finished


class JointSteps:
    """The running searches of one model, advanced together by `step()` (on one thread)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.running: list[_Running] = []

    def __len__(self) -> int:
        return len(self.running)

    def add(self, search: Steps[Any], finished: Finished) -> None:
        """Start `search`: it runs until it asks for its first step (a native search encodes its
        sources there); `finished(result, error)` is called once, when it returns or raises."""
        with torch.inference_mode():
            self._advance(search, None, finished)

    def step(self) -> None:
        """One decoding step of every running search, in one model call. If that call raises,
        every search that took part in it finishes with the error."""
        running, self.running = self.running, []
        try:
            with torch.inference_mode():
                logits = self._decode([r.tokens for r in running], [r.state for r in running])
        except Exception as e:
            for r in running:
                r.search.close()
                r.finished(None, e)
            return
        with torch.inference_mode():
            for r, out in zip(running, logits, strict=True):
                self._advance(r.search, out, r.finished)

    def _decode(self, tokens: list[Tensor], states: list[Any]) -> list[Tensor]:
        if len(tokens) == 1:
            return [self.model.decode_step(tokens[0], states[0])]
        decode_steps = getattr(self.model, "decode_steps", None)
        if decode_steps is None:  # a model without it (a test's toy model): one call per search
            return [self.model.decode_step(t, s) for t, s in zip(tokens, states, strict=True)]
        return decode_steps(tokens, states)

    def _advance(self, search: Steps[Any], logits: Tensor | None, finished: Finished) -> None:
        """Give `search` its logits (None: start it) and keep it running, or report its end."""
        try:
            tokens, state = next(search) if logits is None else search.send(logits)
        except StopIteration as stop:
            finished(stop.value, None)
            return
        except Exception as e:
            finished(None, e)
            return
        self.running.append(_Running(search, tokens, state, finished))
