"""The load: OpenAI `/v1/completions` SSE streams sent with aiohttp, closed loop (a fixed number of clients) or open
loop (Poisson arrivals), each request's token events timed by the client."""

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from .server import MODEL
from .workload import Item


@dataclass
class Record:
    sent: float = 0.0
    status: int = 0
    request_id: str = ""
    events: list[float] = field(default_factory=list)  # perf_counter of every SSE token event
    completion_tokens: int = 0
    prompt_tokens: int = 0
    ended: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200 and bool(self.events)

    @property
    def ttft(self) -> float:
        return self.events[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.ended - self.sent

    @property
    def tokens(self) -> int:
        return self.completion_tokens or len(self.events)


async def one_request(session, url: str, item: Item, record: Record) -> None:
    import orjson

    body = {
        "model": MODEL,
        "prompt": item.prompt,
        "max_tokens": item.max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    record.sent = time.perf_counter()
    try:
        async with session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"}) as resp:
            record.status = resp.status
            if resp.status != 200:
                record.error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                record.ended = time.perf_counter()
                return
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                event = orjson.loads(data)
                if "error" in event:
                    record.error = str(event["error"])[:300]
                    break
                choices = event.get("choices")
                if choices:
                    if choices[0].get("finish_reason") is None:
                        record.events.append(now)
                    if not record.request_id:
                        record.request_id = event.get("id", "")
                if event.get("usage"):
                    record.completion_tokens = event["usage"]["completion_tokens"]
                    record.prompt_tokens = event["usage"]["prompt_tokens"]
            record.ended = time.perf_counter()
            if record.completion_tokens and record.completion_tokens != item.max_tokens and not record.error:
                record.error = f"got {record.completion_tokens} tokens, asked for {item.max_tokens}"
    except Exception as err:  # counted as a failed request
        record.error = f"{type(err).__name__}: {err}"
        record.ended = time.perf_counter()


def new_session():
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))


async def run_closed(session, url: str, items: list[Item], concurrency: int) -> tuple[list[Record], float]:
    """`concurrency` clients, each sending its next request when its previous one ended; (records, start)."""
    records = [Record() for _ in items]
    queue = list(range(len(items)))[::-1]

    async def client():
        while queue:
            i = queue.pop()
            await one_request(session, url, items[i], records[i])

    started = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(min(concurrency, len(items)))])
    return records, started


async def run_poisson(session, url: str, items: list[Item], rate: float, seed: int) -> tuple[list[Record], float]:
    """Open loop: request i is sent at the i-th arrival of a Poisson process of `rate` req/s (the first at 0);
    (records, start)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, len(items))
    gaps[0] = 0.0
    at = np.cumsum(gaps)
    records = [Record() for _ in items]
    started = time.perf_counter()
    tasks = []
    for i, item in enumerate(items):
        delay = started + at[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one_request(session, url, item, records[i])))
    await asyncio.gather(*tasks)
    return records, started
