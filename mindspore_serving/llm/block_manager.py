"""Paged KV-cache blocks: allocation, reference counts and prefix caching.

Physical block 0 is the runner's scratch block and is never handed out, so blocks 1..num_blocks-1
are usable. Each request's `block_table` lists its blocks in position order; the token at position p
lives in block_table[p // block_size] at offset p % block_size.

Prefix caching: once a block is full *and computed* (its keys/values written by a finished step),
it is registered under a hash of its tokens chained with the hash of the block before it, so the
hash names the whole prefix up to the block's end. A new request whose leading blocks hash the same
takes those blocks (ref count + 1) and starts computing after them. A block whose ref count drops to
zero goes to the free queue but stays registered: it can still be hit until it is handed out again.
The free queue is LRU: fresh allocations take from its front; uncached blocks are put at the front
(they are worth nothing), cached ones at the back, a request's last block first so that the tail of
a prefix is evicted before its head.

Only full blocks are ever shared, and a request only writes positions >= its num_computed_tokens,
which start after its shared blocks, so shared blocks are read-only and need no copy-on-write. The same holds
for the choices of one request (`fork`, llm/choices.py): they share the prompt's full blocks, and each
recomputes the partial last block into its own.
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from mindspore_serving.llm.config import blocks_for
from mindspore_serving.llm.model_io import SCRATCH_BLOCK
from mindspore_serving.llm.request import Request


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block: its tokens chained with the hash of the block before it."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash or b"root")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    """Hands out KV blocks to requests; with prefix caching, shares equal full prefix blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 2 or block_size < 1:
            raise ValueError(
                f"BlockManager needs num_blocks >= 2 (block 0 is scratch) and block_size >= 1, "
                f"got num_blocks={num_blocks}, block_size={block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_count = [0] * num_blocks
        self._block_hash: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks) if b != SCRATCH_BLOCK)
        self._num_registered: dict[str, int] = {}
        self.prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache."""
        self.prefix_cache_hits = 0
        """Of those, tokens found."""

    # --- counts -------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, including cached blocks nobody uses (evictable)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests (0.0 .. 1.0)."""
        return 1.0 - len(self._free) / self.num_usable_blocks

    def ref_count(self, block: int) -> int:
        return self._ref_count[block]

    # --- prefix cache -------------------------------------------------------------------------
    def block_hashes(self, request: Request) -> list[bytes]:
        """Hashes of the request's full token blocks (computed once; tokens only ever get appended)."""
        hashes = request.block_hashes
        tokens = request.all_token_ids
        bs = self.block_size
        for i in range(len(hashes), len(tokens) // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[i * bs : (i + 1) * bs]))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Cached blocks holding the longest prefix of the request's tokens, and how many tokens they hold.

        At least the last token is always left to compute, because its logits are needed. No side
        effect: pass the blocks to `allocate` to take them.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = []
        for h in self.block_hashes(request)[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def cache_full_blocks(self, request: Request) -> None:
        """Registers the request's blocks that are now full and computed, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        start = self._num_registered.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self.block_hashes(request)
        for i in range(start, num_full):
            block, h = request.block_table[i], hashes[i]
            if self._block_hash[block] is None and h not in self._cached:
                # NOTE: when another block already holds the same tokens (both computed in one step),
                # the first one stays the cached copy and this one remains private.
                self._block_hash[block] = h
                self._cached[h] = block
        self._num_registered[request.request_id] = num_full

    # --- allocation ---------------------------------------------------------------------------
    def _num_new_blocks(self, request: Request, num_tokens_after: int, num_held: int) -> int:
        return max(0, blocks_for(num_tokens_after, self.block_size) - num_held)

    def can_allocate(self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()) -> bool:
        """Whether `allocate` would succeed."""
        need = self._num_new_blocks(
            request, len(computed_blocks) * self.block_size + num_new_tokens, len(computed_blocks)
        )
        # Cached blocks that nobody holds sit in the free queue; taking them removes them from it.
        evictable_hits = sum(1 for b in computed_blocks if self._ref_count[b] == 0)
        return need <= len(self._free) - evictable_hits

    def allocate(self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()) -> bool:
        """Gives a request without blocks the cached `computed_blocks` (from `get_computed_blocks`) plus
        fresh blocks for `num_new_tokens` more tokens. Returns False, changing nothing, when blocks are short."""
        if request.block_table:
            raise RuntimeError(
                f"request {request.request_id} already holds blocks {request.block_table}; use append_slots"
            )
        if not self.can_allocate(request, num_new_tokens, computed_blocks):
            return False
        for block in computed_blocks:
            self._take(block)
        request.block_table.extend(computed_blocks)
        self._num_registered[request.request_id] = len(computed_blocks)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(computed_blocks) * self.block_size
        need = self._num_new_blocks(
            request, len(computed_blocks) * self.block_size + num_new_tokens, len(computed_blocks)
        )
        request.block_table.extend(self._pop_free() for _ in range(need))
        return True

    def blocks_to_append(self, request: Request, num_new_tokens: int) -> int:
        """Free blocks `append_slots(request, num_new_tokens)` would take."""
        return self._num_new_blocks(request, request.num_computed_tokens + num_new_tokens, len(request.block_table))

    def can_append_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Whether `append_slots` would succeed."""
        return self.blocks_to_append(request, num_new_tokens) <= len(self._free)

    def append_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Extends a request's blocks to hold `num_new_tokens` more tokens after its computed ones.
        Returns False, changing nothing, when blocks are short."""
        need = self.blocks_to_append(request, num_new_tokens)
        if need > len(self._free):
            return False
        request.block_table.extend(self._pop_free() for _ in range(need))
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        """Frees the request's blocks past those that hold its first `num_tokens` tokens: blocks a speculative step
        reserved for proposed tokens the model did not keep, which hold no computed token (so no other request
        shares them and none is in the prefix cache)."""
        keep = blocks_for(num_tokens, self.block_size)
        for block in reversed(request.block_table[keep:]):
            if self._ref_count[block] != 1 or self._block_hash[block] is not None:
                raise RuntimeError(
                    f"block {block} of request {request.request_id} is shared or cached: it holds "
                    f"computed tokens and cannot be trimmed"
                )
            self._release(block, request)
        del request.block_table[keep:]

    def fork(self, parent: Request, child: Request) -> None:
        """Gives a child choice of `parent` (llm/choices.py) the parent's full computed blocks (reference count + 1
        each) and sets its num_computed_tokens to their end. The parent's last, partial block is not shared: the
        child recomputes its tail into a block of its own (copy-on-write by recomputation), which `append_slots`
        gives it when it is scheduled."""
        if child.block_table:
            raise RuntimeError(f"request {child.request_id} already holds blocks {child.block_table}")
        num_full = min(parent.num_computed_tokens, parent.num_prompt_tokens) // self.block_size
        shared = parent.block_table[:num_full]
        for block in shared:
            self._take(block)
        child.block_table.extend(shared)
        child.num_computed_tokens = num_full * self.block_size
        if self.enable_prefix_caching:
            # equal tokens, equal hashes; the shared blocks are registered (or left private) by the parent already
            child.block_hashes[:] = self.block_hashes(parent)[:num_full]
        self._num_registered[child.request_id] = num_full

    def free(self, request: Request) -> None:
        """Releases the request's blocks (cached ones stay reusable until evicted) and empties its table."""
        for block in reversed(request.block_table):
            self._release(block, request)
        request.block_table.clear()
        self._num_registered.pop(request.request_id, None)

    def _release(self, block: int, request: Request) -> None:
        """Drops the request's hold on `block`; a block nobody holds goes back to the free queue: at its end when
        cached (reused last, so that it stays shareable longest), at its front otherwise."""
        self._ref_count[block] -= 1
        if self._ref_count[block] < 0:
            raise RuntimeError(f"block {block} freed more often than taken (request {request.request_id})")
        if self._ref_count[block] == 0:
            self._free[block] = None
            if self._block_hash[block] is None:
                self._free.move_to_end(block, last=False)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached block that nobody holds (e.g. after loading new weights)."""
        for block in list(self._free):
            self._uncache(block)

    # --- internals ----------------------------------------------------------------------------
    def _take(self, block: int) -> None:
        if self._ref_count[block] == 0:
            del self._free[block]
        self._ref_count[block] += 1

    def _pop_free(self) -> int:
        block, _ = self._free.popitem(last=False)
        self._uncache(block)
        self._ref_count[block] = 1
        return block

    def _uncache(self, block: int) -> None:
        h = self._block_hash[block]
        if h is not None:
            self._block_hash[block] = None
            if self._cached.get(h) == block:
                del self._cached[h]
