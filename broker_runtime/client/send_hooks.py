"""The producer's hooks around a send: `on_before_send(msg)` before the first attempt,
`on_send_result(msg, result, error)` once the send is settled. A hook may return an
awaitable; a failing result hook is logged, never raised into the send."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence

from broker_runtime.client.model import SendResult
from broker_runtime.common.message import Message

log = logging.getLogger(__name__)

BeforeSend = Callable[[Message], object]
OnResult = Callable[[Message, SendResult | None, BaseException | None], object]


async def run_before(hooks: Sequence[BeforeSend], msgs: Sequence[Message]) -> None:
    for hook in hooks:
        for m in msgs:
            await _maybe_await(hook(m))


async def run_after(
    hooks: Sequence[OnResult],
    msgs: Sequence[Message],
    result: SendResult | None,
    error: BaseException | None,
) -> None:
    """Each hook once per message; a batch's result split into each message's."""
    for hook in hooks:
        for i, m in enumerate(msgs):
            r = result
            if result is not None and len(msgs) > 1:
                r = SendResult(
                    result.status,
                    result.msg_ids[i],
                    result.offset_msg_id,
                    result.mq,
                    result.queue_offset + i,
                    (result.msg_ids[i],),
                )
            try:
                await _maybe_await(hook(m, r, error))
            except Exception:
                log.exception("on_send_result hook failed")


async def _maybe_await(value: object) -> None:
    if inspect.isawaitable(value):
        await value
