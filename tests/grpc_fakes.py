"""A gRPC future as the worker's step calls see it, finished (or never finishing) as a test says."""


class FakeFuture:
    """`done=False`: it never finishes (a rank blocked in a collective). `raise_on_result`: result() raises it."""

    def __init__(self, reply=None, error=None, done=True, raise_on_result=None):
        self.reply, self.error, self.done, self.raise_on_result = reply, error, done, raise_on_result
        self.cancelled_by_caller = False

    def add_done_callback(self, callback):
        if self.done:
            callback(self)

    def cancelled(self):
        return False

    def exception(self):
        return self.error

    def result(self):
        if self.raise_on_result is not None:
            raise self.raise_on_result
        return self.reply

    def cancel(self):
        self.cancelled_by_caller = True
