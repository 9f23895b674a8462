import { createParser, type EventSourceMessage } from "eventsource-parser";
import { GatewayError } from "../../domain/errors.js";
import type { UpstreamFlow } from "../../domain/chat/ports.js";
import type { UpstreamResponse } from "./http.js";

/** Reading a provider's server-sent events (an OpenAI stream) from an upstream response body. */

/**
 * The server-sent events of a body (an OpenAI stream: `data: {...}` events, then
 * `data: [DONE]`). An event left unterminated when the body ends is still delivered, as
 * providers sometimes omit the final blank line. Field errors are ignored as the SSE standard
 * says; an event larger than `maxEventBytes` (default 1 MiB) fails with `upstream_error`.
 */
export function readEventStream(
  body: AsyncIterable<Uint8Array>,
  opts: { maxEventBytes?: number } = {},
): AsyncGenerator<EventSourceMessage, void, undefined> {
  return readEvents(body, opts.maxEventBytes, (event) => event);
}

/**
 * The `data` of each server-sent event of a body, as {@link readEventStream} reads them: what
 * the chat relay needs of a stream, without an object per event on its way.
 */
export function readEventData(
  body: AsyncIterable<Uint8Array>,
  opts: { maxEventBytes?: number } = {},
): AsyncGenerator<string, void, undefined> {
  return readEvents(body, opts.maxEventBytes, (event) => event.data);
}

const decodeStreaming = { stream: true } as const;

/**
 * The `data` of each server-sent event of a body pushed to `into` as {@link readEventData} reads
 * them, without a promise or iterator result per event: the events of one read are handed on
 * in order, and `into` returning false for any of them pauses the body after that read (at most
 * one read's events are handed on past a full client, as before).
 */
export function flowEventData(
  response: Pick<UpstreamResponse, "flow">,
  into: (data: string) => boolean,
  opts: { maxEventBytes?: number } = {},
): UpstreamFlow {
  let more = true;
  let stopped = false;
  let failure: GatewayError | undefined;
  const parser = createParser({
    maxBufferSize: opts.maxEventBytes ?? 1024 * 1024,
    onEvent: (event) => {
      // Nothing after the reader stopped (the parser may hold more events of the same read).
      if (stopped) return;
      if (!into(event.data)) more = false;
    },
    onError: (err) => {
      if (err.type === "max-buffer-size-exceeded") {
        failure = new GatewayError("upstream_error", "upstream stream event is too large");
      }
    },
  });
  const decoder = new TextDecoder();
  const inner = response.flow((chunk) => {
    more = true;
    parser.feed(decoder.decode(chunk, decodeStreaming));
    if (failure !== undefined) throw failure;
    return more;
  });
  // Terminating whatever is left at the body's end dispatches an unfinished last event.
  const done = inner.done.then(() => {
    if (stopped) return;
    parser.feed(`${decoder.decode()}\n\n`);
    if (failure !== undefined) throw failure;
  });
  return {
    done,
    resume: () => inner.resume(),
    stop: () => {
      stopped = true;
      inner.stop();
    },
    fail: (error) => {
      stopped = true;
      inner.fail(error);
    },
  };
}

async function* readEvents<T>(
  body: AsyncIterable<Uint8Array>,
  maxEventBytes: number | undefined,
  pick: (event: EventSourceMessage) => T,
): AsyncGenerator<T, void, undefined> {
  // Events parsed from one chunk, yielded before the next is read (one array, reused).
  const pending: T[] = [];
  let failure: GatewayError | undefined;
  const parser = createParser({
    maxBufferSize: maxEventBytes ?? 1024 * 1024,
    onEvent: (event) => pending.push(pick(event)),
    onError: (err) => {
      if (err.type === "max-buffer-size-exceeded") {
        failure = new GatewayError("upstream_error", "upstream stream event is too large");
      }
    },
  });
  const decoder = new TextDecoder();
  for await (const chunk of body) {
    parser.feed(decoder.decode(chunk, decodeStreaming));
    if (failure !== undefined) throw failure;
    for (let i = 0; i < pending.length; i++) yield pending[i] as T;
    pending.length = 0;
  }
  // Terminating whatever is left dispatches an unfinished last event (and is a no-op after a
  // complete one).
  parser.feed(`${decoder.decode()}\n\n`);
  if (failure !== undefined) throw failure;
  for (let i = 0; i < pending.length; i++) yield pending[i] as T;
  pending.length = 0;
}
