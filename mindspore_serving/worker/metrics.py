"""A worker's metric bookkeeping: per model, the batches its calls carried and how long they ran. Updated in place
by the model executors' threads; read by `WorkerService.Metrics` when the master scrapes."""

from mindspore_serving.common import metrics as m


class ModelStats:
    __slots__ = ("batch", "padding", "execution")

    def __init__(self):
        self.batch = m.histogram(m.P + "model_batch_size")
        self.padding = 0
        self.execution = m.histogram(m.P + "model_execution_seconds")

    def record(self, filled: int, padded: int, seconds: float) -> None:
        self.batch.observe(filled)
        self.padding += padded
        self.execution.observe(seconds)


class WorkerMetrics:
    def __init__(self):
        self.models: dict[str, ModelStats] = {}

    def model(self, model_key: str) -> ModelStats:
        stats = self.models.get(model_key)
        if stats is None:
            stats = self.models[model_key] = ModelStats()
        return stats

    def samples(self) -> list:
        out = []
        for key, stats in list(self.models.items()):
            labels = {"model": key}
            out.append(m.sample(m.P + "model_batch_size", labels, hist=stats.batch))
            out.append(m.sample(m.P + "model_batch_padding", labels, stats.padding))
            out.append(m.sample(m.P + "model_execution_seconds", labels, hist=stats.execution))
        return out


WORKER_METRICS = WorkerMetrics()
"""This worker process's bookkeeping (one servable per process)."""
