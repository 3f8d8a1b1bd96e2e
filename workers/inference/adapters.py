"""A tenant's adapters in its worker, loaded when first asked for and let go when least used.

LoRA adapters load into one PeftModel over the worker's base model and share its engine: each row
of a batch names its adapter (peft's mixed batches: the rows of each adapter go through its own
LoRA matrices, the Punica / S-LoRA idea in plain torch; rows of the base model through none).
IA3 adapters of one config share a batch in a model of their own (groups.py: each row scaled by
its own adapter's vectors). Prompt and prefix tuning change only a prompt's forward (their
virtual tokens go into the request's cache): a model of theirs over the shared base prefills the
prompt, and the rows then decode as the base model's, in the same batch. A method that cannot
share a batch (DoRA, AdaLoRA) gets an engine of its own over a base model of its own (only the
local parts: the frozen layers are the executor's).
What stays resident is bounded (`Budget`): a number of adapters, the memory they hold, and one
tenant's share of it (a shared worker serves many tenants: one tenant's burst of cold adapters
never pushes out more than its own). Past a bound, the least recently used adapters that no
request is using go (if all are in use, they wait until `settle`). When a LoRA adapter would
push past a bound, it takes the place of the least recently used idle one of its shape (the
tenant's own, if the tenant's share is the bound): its tensors are copied over the other's
(slots.py), no module is added or removed.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path

from peft import PeftConfig, PeftModel, PeftModelForCausalLM
from torch import nn

from wire.manager import AdapterCache, AdapterRef
from workers.inference.budget import Budget, Holding, tensor_bytes
from workers.inference.engine import InferenceEngine
from workers.inference.groups import Groups, batch_family, read_adapter
from workers.inference.loaded import InUse, Loaded
from workers.inference.slots import (
    WEIGHTS,
    clone,
    fill,
    place_of,
    read_fitting,
    shape_of,
)

log = logging.getLogger("workers.adapters")


class AdapterLoadError(Exception):
    pass


class Adapters:
    def __init__(self, base: nn.Module, make_engine: Callable[[nn.Module], InferenceEngine],
                 build_base: Callable[[], nn.Module], *, device: str = "cpu",
                 budget: Budget | None = None, backend: str = "") -> None:
        self.base, self.make_engine, self.build_base = base, make_engine, build_base
        self.device, self.budget, self.backend = device, budget or Budget(), backend
        self.engine = make_engine(base)  # the base model's rows and every LoRA adapter's
        self.groups = Groups(make_engine, build_base, device)
        self.peft: PeftModel | None = None
        self.loaded: dict[str, Loaded] = {}
        self.unloading: set[str] = set()
        self.past_budget = False  # after a load, until adapters no request uses could go
        self.loads = self.let_go = 0
        self._names = (f"adapter{i}" for i in itertools.count())

    def engines(self) -> list[InferenceEngine]:
        return [self.engine, *self.groups.engines(),
                *(a.engine for a in self.loaded.values() if a.engine is not self.engine
                  and a.group is None)]

    def route(self, model: str, ref: AdapterRef | None,
              tenant: str = "") -> tuple[InferenceEngine, str | None]:
        """The engine that serves `model` (of `tenant`) and the adapter name its rows carry
        (None: the base model's rows, or an engine of the adapter's own); loads the adapter if
        needed."""
        if ref is None:
            return self.engine, None
        loaded = self.loaded.get(model)
        if loaded is None:
            loaded = self.loaded[model] = self._load(model, Path(ref.path), tenant)
            self.loads += 1
            self.past_budget = True
            self.settle(keep=model)
        self.unloading.discard(model)
        loaded.last_used = time.monotonic()
        return loaded.engine, loaded.name if loaded.shared else None

    def cache(self, key: str) -> AdapterCache:
        """What the worker holds resident, for its manager."""
        return AdapterCache(key, len(self.loaded), sum(a.bytes for a in self.loaded.values()),
                            self.loads, self.let_go)

    def prefill_of(self, model: str) -> PeftModel | None:
        """The model a request for `model` prefills its prompt with (prompt or prefix tuning;
        None: the engine's own)."""
        loaded = self.loaded.get(model)
        return loaded.prefill if loaded is not None else None

    def unload(self, model: str) -> None:
        """Let `model` go once no request uses it."""
        if model in self.loaded:
            self.unloading.add(model)
            self.settle()

    def settle(self, keep: str | None = None) -> None:
        """Let go of what was asked to go, and of the least recently used adapters while the
        worker or their tenant is past its budget, as far as no request is using them (nor is
        about to: `keep`). Called after every engine step: nothing to look at unless something
        is to go."""
        if not self.unloading and not self.past_budget:
            return
        in_use = InUse()
        for model in [m for m in self.unloading if not self.loaded[m].busy(in_use)]:
            self._drop(model)
        idle = sorted((a for a in self.loaded.values() if not a.busy(in_use)
                       and a.model != keep and a.model not in self.unloading),
                      key=lambda a: a.last_used)
        holding = self._holding()
        for adapter in idle:
            if holding.past(adapter.tenant):
                self._drop(adapter.model)
                holding.remove(adapter)
        self.past_budget = holding.past()

    def _holding(self) -> Holding:
        """What the adapters that stay hold against the budget."""
        return Holding(self.budget, (a for a in self.loaded.values()
                                     if a.model not in self.unloading))

    def _load(self, model: str, path: Path, tenant: str) -> Loaded:
        started = time.perf_counter()
        name = next(self._names)
        try:
            family = batch_family(path)
            if family == "ia3":
                loaded = self._take_place(model, path, tenant) or \
                    self._copy_place(model, name, path, tenant)
                if loaded is None:
                    engine, group, size = self.groups.load(name, path)
                    loaded = Loaded(model, name, engine, shared=True, tenant=tenant, bytes=size,
                                    shape=group, group=group)
            elif family == "prompt":
                prompt = PeftModelForCausalLM(self.base, PeftConfig.from_pretrained(path),
                                              adapter_name=name, low_cpu_mem_usage=True).eval()
                read_adapter(prompt, name, path, self.device)
                loaded = Loaded(model, name, self.engine, shared=False, tenant=tenant,
                                bytes=tensor_bytes(prompt.prompt_encoder.parameters()),
                                prefill=prompt)
            elif family == "lora":
                loaded = self._take_place(model, path, tenant) or \
                    self._copy_place(model, name, path, tenant)
                if loaded is None:
                    self._load_shared(name, path)
                    size = tensor_bytes(place_of(self.peft, name).values()) or \
                        (path / WEIGHTS).stat().st_size
                    loaded = Loaded(model, name, self.engine, shared=True, tenant=tenant,
                                    bytes=size, shape=shape_of(path))
            else:
                own = PeftModel.from_pretrained(self.build_base(), path,
                                                torch_device=self.device).eval()
                size = tensor_bytes(itertools.chain(own.parameters(), own.buffers()))
                loaded = Loaded(model, name, self.make_engine(own), shared=False, tenant=tenant,
                                bytes=size)
        except Exception as exc:
            log.exception("adapter %s failed to load", model)
            raise AdapterLoadError(f"{type(exc).__name__}: {exc}") from exc
        log.info("adapter %s loaded in %.1f ms (%d resident)", model,
                 1e3 * (time.perf_counter() - started), len(self.loaded) + 1)
        return loaded

    def _take_place(self, model: str, path: Path, tenant: str) -> Loaded | None:
        """`model` loaded over the least recently used idle adapter of its shape (LoRA, or IA3 in
        its group; the tenant's own when only the tenant's share is full), when one more would
        be past the budget and its file fits that adapter's tensors; None otherwise."""
        shape = shape_of(path)
        in_use = InUse()
        idle = [a for a in self.loaded.values()
                if a.shared and a.shape == shape and not a.busy(in_use)]
        if not idle:
            return None
        holding = self._holding()  # with the newcomer: the same shape holds the same bytes
        holding.add(Loaded(model, "", self.engine, shared=True, tenant=tenant,
                           bytes=idle[0].bytes))
        if not holding.past(tenant):
            return None
        if holding.past_tenant_only(tenant):
            idle = [a for a in idle if a.tenant == tenant]
            if not idle:
                return None
        other = min(idle, key=lambda a: a.last_used)
        if other.place is None:
            other.place = place_of(self._model_of(other), other.name)
        tensors = read_fitting(path, other.place)
        if tensors is None:
            return None
        del self.loaded[other.model]
        self.unloading.discard(other.model)
        self.let_go += 1
        try:
            fill(other.place, tensors)
        except Exception:
            self._delete_from_model(other)  # half overwritten: it serves nothing any more
            raise
        log.info("adapter %s let go for %s, loaded in its place", other.model, model)
        return Loaded(model, other.name, other.engine, shared=True, tenant=tenant,
                      bytes=other.bytes, shape=shape, place=other.place, group=other.group)

    def _copy_place(self, model: str, name: str, path: Path, tenant: str) -> Loaded | None:
        """`model` loaded into a copy of a resident adapter's modules of its shape (LoRA, or IA3
        in its group: peft's loader walks the whole model, longer with every adapter resident);
        None when none is resident or its file does not fit."""
        shape = shape_of(path)
        source = next((a for a in self.loaded.values() if a.shared and a.shape == shape), None)
        holder = None if source is None else self._model_of(source)
        if holder is None:
            return None
        if source.place is None:
            source.place = place_of(holder, source.name)
        tensors = read_fitting(path, source.place)
        config = PeftConfig.from_pretrained(path)
        config.inference_mode = True  # as peft's loader marks an adapter loaded to serve
        place = None if tensors is None else clone(holder, source.name, source.place, name,
                                                   config)
        if place is None:
            return None
        loaded = Loaded(model, name, source.engine, shared=True, tenant=tenant,
                        bytes=source.bytes, shape=shape, place=place, group=source.group)
        try:
            fill(place, tensors)
        except Exception:
            self._delete_from_model(loaded)
            raise
        log.info("adapter %s made as a copy of %s's modules", model, source.model)
        return loaded

    def _model_of(self, adapter: Loaded) -> PeftModel | None:
        """The model holding a shared adapter: the LoRA one, or its IA3 group's."""
        return self.peft if adapter.group is None else self.groups.model(adapter.group)

    def _load_shared(self, name: str, path: Path) -> None:
        if self.peft is None:
            config = PeftConfig.from_pretrained(path)  # a bad config fails here, base untouched
            self.peft = PeftModel(self.base, config, adapter_name=name,
                                  low_cpu_mem_usage=True).eval()
            self.engine.use(self.peft, mixed=True)  # from here on, the base model's rows say so
        try:
            read_adapter(self.peft, name, path, self.device)
        except Exception:
            if name in self.peft.peft_config:
                self._delete(name)
            raise

    def _drop(self, model: str) -> None:
        adapter = self.loaded.pop(model)
        self.let_go += 1
        self.unloading.discard(model)
        self._delete_from_model(adapter)
        log.info("adapter %s let go (%d resident)", model, len(self.loaded))

    def _delete_from_model(self, adapter: Loaded) -> None:
        if adapter.group is not None:
            self.groups.delete(adapter.group, adapter.name)
        elif adapter.shared:
            self._delete(adapter.name)

    def _delete(self, name: str) -> None:
        """Delete a shared adapter; with the last one, take the LoRA layers out of the base
        model again (peft runs no PeftModel without an adapter)."""
        self.peft.delete_adapter(name)
        if not self.peft.peft_config:
            self.peft.base_model.unload()  # the base layers back in their places
            self.peft = None
            self.engine.use(self.base, mixed=False)
