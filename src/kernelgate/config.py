"""Launch configurations: the space a Triton implementation may be tuned over.

A configuration maps compile-time parameter names (block sizes, ``num_warps``, ``num_stages``) to
integers. A :class:`ConfigSpace` is the product of the values each parameter may take:

>>> space = ConfigSpace(BLOCK_N=(1024, 4096), num_warps=(4, 8))
>>> len(space), [config_label(c) for c in space][:2]
(4, ['BLOCK_N=1024,num_warps=4', 'BLOCK_N=1024,num_warps=8'])
>>> space.validate({"BLOCK_N": 4096, "num_warps": 8}) is not None, space.validate({"BLOCK_N": 3})
(True, None)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from kernelgate.errors import DeclarationError

__all__ = ["Config", "ConfigSpace", "config_label"]

Config = Mapping[str, int]

# Launch options Triton reads from the launch call rather than from the kernel's parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
MAX_THREADS_PER_PROGRAM = 1024


def config_label(config: Config) -> str:
    """A short, stable text form: ``BLOCK_N=4096,num_warps=8``."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


class ConfigSpace:
    """The values each compile-time parameter of an implementation may take.

    Configurations whose warps exceed the threads a program may have are never produced.
    """

    def __init__(self, **params: tuple[int, ...]) -> None:
        for name, values in params.items():
            if not isinstance(values, tuple) or not values:
                raise DeclarationError(f"ConfigSpace: {name} must be a non-empty tuple of ints; got {values!r}.")
            # 0 is a switch's "off" (a constexpr flag such as PREFETCH); sizes and counts are positive.
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
                raise DeclarationError(f"ConfigSpace: {name} must hold non-negative ints; got {values!r}.")
        self.params: Mapping[str, tuple[int, ...]] = MappingProxyType(dict(sorted(params.items())))

    def __iter__(self) -> Iterator[Config]:
        names = list(self.params)
        for values in itertools.product(*self.params.values()):
            config = MappingProxyType(dict(zip(names, values, strict=True)))
            if config.get("num_warps", 1) * 32 <= MAX_THREADS_PER_PROGRAM:
                yield config

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"ConfigSpace({inner})"

    def validate(self, config: object) -> Config | None:
        """``config`` as a read-only mapping if it is a member of this space, else ``None``.

        Used on every configuration read from a cache file, so a hostile or stale file cannot
        inject a configuration the implementation does not declare.
        """
        if not isinstance(config, Mapping) or set(config) != set(self.params):
            return None
        for name, value in config.items():
            if isinstance(value, bool) or not isinstance(value, int) or value not in self.params[name]:
                return None
        if config.get("num_warps", 1) * 32 > MAX_THREADS_PER_PROGRAM:
            return None
        return MappingProxyType({k: int(config[k]) for k in self.params})
