"""The threads of this process that are running, sampled while a block runs: how the models
bench (mhapy.models.bench) sees a runtime whose workers spin between parallel regions."""

from __future__ import annotations


class BusyThreads:
    """Counts this process's running threads (state R in /proc/self/task/*/stat), the sampler's
    own aside, every `period` seconds while it is entered: a spinning OpenMP worker counts as
    busy, a sleeping one not. mean and most over the samples (0 where /proc has no tasks)."""

    def __init__(self, period: float = 0.002) -> None:
        import threading

        self.period, self.samples, self._stop = period, [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import os
        import threading

        me = str(threading.get_native_id())
        while not self._stop.wait(self.period):
            busy = 0
            try:
                tasks = os.listdir("/proc/self/task")
            except OSError:
                return
            for task in tasks:
                if task == me:
                    continue
                try:
                    with open(f"/proc/self/task/{task}/stat", encoding="ascii", errors="replace") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                busy += state == "R"
            self.samples.append(busy)

    def __enter__(self) -> BusyThreads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    @property
    def most(self) -> int:
        return max(self.samples, default=0)
