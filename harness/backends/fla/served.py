"""Which implementation FLA's backend dispatch chose for each call, read from FLA's own registry objects.

FLA 0.6 (``fla/backends.py``) keeps one ``BackendRegistry`` per operation (``_operation_registries``, keyed
'gated_delta_rule', 'common', 'kda', ...) and one per function-dispatched entry point (``_function_registries``,
e.g. ``chunk_kda``). A dispatched call walks its registry's backends by priority and, for the first one that is
available, enabled and whose ``verify(function_name, *args)`` accepts, calls ``get_implementation(function_name)``
(fla/backends.py:170-198); otherwise the decorated Triton function runs. FLA only *logs* the choice, once per
(operation, function, backend) per process, so the log cannot say which call went where.

``ServedLog.attach`` wraps those two methods on each registered backend *instance* (FLA's own classes stay
untouched): ``verify`` records a rejection with FLA's reason, ``get_implementation`` returns the implementation
wrapped so that calling it records ``operation.function -> backend_type``. Selection is unchanged: the wrappers
return what the originals return. A dispatched function with no record ran FLA's default (Triton) function.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_MARK = "_deltacheck_served_log"  # set on a backend instance once its methods are wrapped


@dataclass
class ServedLog:
    served: list[tuple[str, str]] = field(default_factory=list)  # (operation.function, backend_type), call order
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (operation.function, backend_type, why)

    def clear(self) -> None:
        self.served.clear()
        self.rejected.clear()

    def attach(self, backends_module) -> int:
        """Wrap every backend registered in ``backends_module`` (``fla.backends`` or a double of it) that is not
        wrapped yet; returns how many registries it saw. Safe to call before every run: backends registered
        since (a lazily imported op module) are picked up."""
        registries = [*getattr(backends_module, "_operation_registries", {}).values(),
                      *getattr(backends_module, "_function_registries", {}).values()]
        for registry in registries:
            for backend in list(getattr(registry, "_backends", {}).values()):
                if getattr(backend, _MARK, None) is not self:
                    self._wrap(registry.operation_name, backend)
        return len(registries)

    def _wrap(self, operation: str, backend) -> None:
        # The originals are taken from the class, so wrapping an instance twice (another log) does not nest.
        cls = type(backend)
        kind = str(backend.backend_type)
        log = self

        def verify(function_name, *args, **kwargs):
            accepted, reason = cls.verify(backend, function_name, *args, **kwargs)
            if not accepted:
                log.rejected.append((f"{operation}.{function_name}", kind, str(reason)))
            return accepted, reason

        def get_implementation(function_name):
            implementation = cls.get_implementation(backend, function_name)
            if implementation is None:
                return None

            def recorded(*args, **kwargs):
                log.served.append((f"{operation}.{function_name}", kind))
                return implementation(*args, **kwargs)

            return recorded

        backend.verify = verify
        backend.get_implementation = get_implementation
        setattr(backend, _MARK, self)

    def summary(self, entry: str | None, default: str = "triton") -> dict:
        """The result metrics for what ran since the last ``clear``: ``engine`` (who served the entry point, then
        each other dispatched piece as ``backend:function``), ``served_calls`` and ``dispatch_rejected``.

        ``entry`` is the op's function name (``chunk_gated_delta_rule``): a record for it names its server, no
        record means ``default`` (FLA's own Triton function) served it. A backward has no entry of its own (it is
        the autograd backward of whoever served the forward): pass None and the forward's server as ``default``."""
        top, pieces = default, {}
        for where, kind in self.served:
            function = where.rsplit(".", 1)[-1]
            if entry is not None and function == entry:
                top = kind
            else:
                pieces[f"{kind}:{function}"] = None
        out = {"engine": " + ".join([top, *pieces])}
        if self.served:
            out["served_calls"] = list(dict.fromkeys(f"{w} -> {k}" for w, k in self.served))
        if self.rejected:
            out["dispatch_rejected"] = list(dict.fromkeys(f"{w}: {k} rejected: {r}" for w, k, r in self.rejected))
        return out
