import { setMaxListeners } from "node:events";
import { createServer, type IncomingHttpHeaders, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * A fake OpenAI-compatible model provider for tests: a real `node:http` server on 127.0.0.1,
 * port 0. It serves `GET /v1/models` and `POST /v1/chat/completions` (JSON, or SSE with
 * `"stream": true`), records every request, and can be told to misbehave (no usage, no model
 * list, an error status, a stream cut mid-way, slow chunks). A test fixture: never imported by
 * `src/`.
 */

export interface FakeUpstreamOptions {
  /** Model ids listed and accepted (a chat for another model gets 404). Default `["fake-model"]`. */
  models?: readonly string[];
  /** Bearer token every request must present (401 otherwise). Default: none needed. */
  token?: string | undefined;
  /** Leave `usage` out of JSON answers and the usage chunk out of streams. */
  omitUsage?: boolean;
  /** `false` makes `GET /v1/models` answer 404. Default true. */
  listModels?: boolean;
  /** Content chunks of a completion (each one "token"). Default 3. */
  chunks?: number;
  /** Pause before a JSON answer and between stream chunks, in ms. Default 0. */
  delayMs?: number;
  /** Pause before answering `GET /v1/models` (a liveness probe), in ms. Default 0. */
  modelsDelayMs?: number;
  /** Destroy the socket mid-stream, after `failAfterChunks` content chunks. */
  failMidStream?: boolean;
  /** Content chunks sent before `failMidStream` cuts the stream. Default 1. */
  failAfterChunks?: number;
  /**
   * Usage reported instead of the real counts (e.g. to over-report), with usage details
   * (`prompt_tokens_details`, `completion_tokens_details`) sent as given, hostile ones too.
   */
  usage?:
    | {
        prompt_tokens: number;
        completion_tokens: number;
        prompt_tokens_details?: Record<string, unknown>;
        completion_tokens_details?: Record<string, unknown>;
      }
    | undefined;
  /**
   * A provider that inflates its usage claims (issue 27): `outputLimit` claims the request's
   * output limit (`max_completion_tokens`, else `max_tokens`) as `completion_tokens` whatever it
   * answered; `promptTimesCharacters` claims that many times the characters of the messages'
   * text as `prompt_tokens`. Applied after `usage`.
   */
  inflateUsage?: { outputLimit?: boolean; promptTimesCharacters?: number } | undefined;
  /** Answer chat completions with this error status before any body byte (e.g. 500, 503). */
  failStatus?: number | undefined;
  /** Serve the API under this path prefix (e.g. `/base`); `url` includes it. Default "". */
  basePath?: string;
  /** Extra headers on every answer (a hostile provider's `set-cookie`, `x-gateway-*`...). */
  responseHeaders?: Record<string, string> | undefined;
  /** Destroy the connection of a chat completion before any response byte (a reset). */
  resetBeforeHeaders?: boolean | undefined;
  /** Hold a chat completion this long before any response byte (or until the client leaves). */
  stallBeforeHeadersMs?: number | undefined;
  /**
   * In a stream, stop sending after this many content chunks without closing the connection
   * (until the client leaves).
   */
  stallAfterChunks?: number | undefined;
  /**
   * Honour `n`: answer `n` choices, each the same words, and report their sum as completion
   * tokens; a stream carries every choice's piece in one chunk (as a batching server may).
   * Default false (one choice whatever `n` says).
   */
  honourN?: boolean | undefined;
  /** Answer with bytes that are not JSON: a JSON answer's body, and every SSE event's data. */
  garbage?: boolean | undefined;
  /** End a stream cleanly without `data: [DONE]` (a wrong answer, not a broken connection). */
  omitDone?: boolean | undefined;
  /**
   * A stream's body exactly as these pieces (a hostile provider's framing): each piece is its own
   * write, a turn of the event loop apart with Nagle off, so the gateway reads them split where
   * they are split; then the response ends.
   */
  rawStream?: readonly Uint8Array[] | undefined;
  /**
   * A stream that never ends: content chunks (each one "token", about `endlessChunkBytes`
   * long) written as fast as the connection takes them, waiting for `drain` whenever a write
   * says the socket is full, until the client leaves. `streamedBytes` counts what was written.
   */
  endless?: boolean | undefined;
  /** Size of an endless stream's chunks. Default 1024. */
  endlessChunkBytes?: number | undefined;
  /**
   * Answer a request that offers `tools` (and whose last message is not a tool result) with a
   * call of its first tool, arguments `toolArguments` (streamed in two pieces). A request whose
   * last message is a tool result is answered "tool said <its content>". Default false.
   */
  toolCalls?: boolean | undefined;
  /**
   * Ignore the request's output limit (`max_tokens` / `max_completion_tokens`): always send
   * `chunks` content chunks (a provider that generates past what was priced). Default false.
   */
  ignoreLimit?: boolean | undefined;
  /** Members added to the top level of a JSON answer (a provider's own `x_gateway`...). */
  extraMembers?: Record<string, unknown> | undefined;
  /** The arguments of a tool call (`toolCalls`). Default `{"city":"Paris"}`. */
  toolArguments?: string | undefined;
  /**
   * `false`: ignore a `response_format` JSON schema and answer plain words (a provider that
   * cannot do structured output fails the gateway's `json_schema` feature check). Default true.
   */
  jsonSchema?: boolean | undefined;
  /**
   * The answer's pieces, from the request's body (a model the test drives, e.g. the n-gram
   * fixture, test/helpers/ngram-lm.ts); undefined: the default words. At most the request's
   * token limit of them are sent, as with the default words.
   */
  answer?: ((request: Record<string, unknown>) => string[] | undefined) | undefined;
  /**
   * Answer a request with `logprobs: true` with the first choice's log-probabilities, one entry
   * per piece (its `token` the piece, `bytes` its UTF-8): `true` gives each piece -0.25 with one
   * less probable alternative; a function gives each piece's value and alternatives (a model the
   * test drives, or a provider's lie). Default: none given.
   */
  logprobs?: true | LogprobsOf | undefined;
}

/** Each piece's log-probability and alternatives (`top_logprobs`), for a request's pieces. */
export type LogprobsOf = (
  request: Record<string, unknown>,
  pieces: readonly string[],
) => { logprob: number; top_logprobs: { token: string; logprob: number }[] }[];

function logprobEntries(
  opts: FakeUpstreamOptions,
  request: Record<string, unknown>,
  pieces: readonly string[],
): Record<string, unknown>[] | undefined {
  if (request.logprobs !== true || opts.logprobs === undefined) return undefined;
  const values =
    opts.logprobs === true
      ? pieces.map(() => ({ logprob: -0.25, top_logprobs: [{ token: "x", logprob: -2 }] }))
      : opts.logprobs(request, pieces);
  return pieces.map((token, i) => ({
    token,
    bytes: [...Buffer.from(token, "utf8")],
    logprob: values[i]?.logprob ?? 0,
    top_logprobs: values[i]?.top_logprobs ?? [],
  }));
}

export interface FakeRequest {
  readonly method: string;
  /** Path without the base path and query, e.g. `/v1/chat/completions`. */
  readonly path: string;
  readonly headers: IncomingHttpHeaders;
  /** The parsed JSON body, the raw text when it is not JSON, undefined when empty. */
  readonly body: unknown;
  /** The body's bytes as text (how the JSON was laid out). */
  readonly raw: string;
  /** True once the connection closed before the response was complete (client went away). */
  readonly closedEarly: boolean;
  /** Settles when the exchange ends: the response completed, or the connection closed first. */
  readonly finished: Promise<"completed" | "aborted">;
}

export interface FakeUpstream {
  /** Endpoint URL, e.g. `http://127.0.0.1:41234` (plus the base path). */
  readonly url: string;
  readonly port: number;
  /** Every request received, in order. */
  readonly requests: FakeRequest[];
  /** Requests received on `path` (e.g. `/v1/models`). */
  calls(path: string): number;
  setOptions(partial: Partial<FakeUpstreamOptions>): void;
  /** Ends every hold under way now (`stallBeforeHeadersMs`): those requests go on at once. */
  releaseHolds(): void;
  /**
   * Destroys the connection of every chat stream under way now (a provider that dies mid-stream
   * at a moment the test chooses, e.g. once what it sent has reached the client; with
   * `stallAfterChunks` the stream is waiting there). Returns how many were cut.
   */
  cutStreams(): number;
  /** Connections accepted so far (keep-alive reuse keeps this low). */
  readonly connections: number;
  /** Connections that have closed so far. */
  readonly closedConnections: number;
  /** Bytes of chat stream bodies written so far (what `write` accepted). */
  readonly streamedBytes: number;
  /** Content chunks of endless streams written so far. */
  readonly streamedChunks: number;
  /** Closes the server and every open connection. Idempotent. */
  stop(): Promise<void>;
}

const defaults: Required<
  Omit<
    FakeUpstreamOptions,
    | "token"
    | "answer"
    | "logprobs"
    | "usage"
    | "inflateUsage"
    | "failStatus"
    | "responseHeaders"
    | "resetBeforeHeaders"
    | "stallBeforeHeadersMs"
    | "stallAfterChunks"
    | "garbage"
    | "omitDone"
    | "honourN"
    | "rawStream"
    | "endless"
    | "endlessChunkBytes"
    | "toolCalls"
    | "toolArguments"
    | "jsonSchema"
    | "ignoreLimit"
    | "extraMembers"
  >
> = {
  models: ["fake-model"],
  omitUsage: false,
  listModels: true,
  chunks: 3,
  delayMs: 0,
  modelsDelayMs: 0,
  failMidStream: false,
  failAfterChunks: 1,
  basePath: "",
};

export async function startFakeUpstream(initial: FakeUpstreamOptions = {}): Promise<FakeUpstream> {
  let options: FakeUpstreamOptions & typeof defaults = { ...defaults, ...initial };
  // One signal every hold under way listens on (any number of them: no listener warning).
  const newHolds = () => {
    const controller = new AbortController();
    setMaxListeners(0, controller.signal);
    return controller;
  };
  let holds = newHolds();
  const requests: FakeRequest[] = [];
  const sockets = new Set<Socket>();
  let connections = 0;
  let closedConnections = 0;
  let created = 0;
  let streamedBytes = 0;
  let streamedChunks = 0;
  /** Chat streams whose headers are sent and whose response has not closed. */
  const openStreams = new Set<ServerResponse>();

  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      let body: unknown = text === "" ? undefined : text;
      try {
        if (text !== "") body = JSON.parse(text) as unknown;
      } catch {
        // kept as text
      }
      const url = new URL(req.url ?? "/", "http://fake");
      const base = options.basePath;
      const path =
        base !== "" && url.pathname.startsWith(base)
          ? url.pathname.slice(base.length) || "/"
          : url.pathname;
      let closedEarly = false;
      const finished = new Promise<"completed" | "aborted">((resolve) => {
        res.on("close", () => {
          closedEarly = !res.writableFinished;
          resolve(closedEarly ? "aborted" : "completed");
        });
      });
      requests.push({
        method: req.method ?? "",
        path,
        headers: req.headers,
        body,
        raw: text,
        get closedEarly() {
          return closedEarly;
        },
        finished,
      });
      for (const [name, value] of Object.entries(options.responseHeaders ?? {}))
        res.setHeader(name, value);
      handle(req.method ?? "", path, req.headers, body, res).catch(() => res.destroy());
    });
  });
  server.on("connection", (socket) => {
    connections++;
    sockets.add(socket);
    socket.on("close", () => {
      closedConnections++;
      sockets.delete(socket);
    });
  });

  async function handle(
    method: string,
    path: string,
    headers: IncomingHttpHeaders,
    body: unknown,
    res: ServerResponse,
  ): Promise<void> {
    const opts = options;
    if (opts.token !== undefined && headers.authorization !== `Bearer ${opts.token}`) {
      return sendError(res, 401, "invalid_api_key", "missing or wrong bearer token");
    }
    if (method === "GET" && path === "/v1/models") {
      if (opts.modelsDelayMs > 0) await sleep(opts.modelsDelayMs);
      if (!opts.listModels) return sendError(res, 404, "not_found", "no such route");
      return sendJson(res, 200, {
        object: "list",
        data: opts.models.map((id) => ({ id, object: "model", created: 0, owned_by: "fake" })),
      });
    }
    if (method === "POST" && path === "/v1/chat/completions") {
      return chat(body, res, opts);
    }
    return sendError(res, 404, "not_found", "no such route");
  }

  async function chat(body: unknown, res: ServerResponse, opts: typeof options): Promise<void> {
    if (typeof body !== "object" || body === null || Array.isArray(body)) {
      return sendError(res, 400, "invalid_request", "body must be a JSON object");
    }
    const request = body as Record<string, unknown>;
    const model = request.model;
    if (typeof model !== "string" || !opts.models.includes(model)) {
      return sendError(res, 404, "model_not_found", "the model does not exist");
    }
    if (!Array.isArray(request.messages) || request.messages.length === 0) {
      return sendError(res, 400, "invalid_request", "messages are required");
    }
    if (opts.failStatus !== undefined) {
      return sendError(res, opts.failStatus, "upstream_failure", "the fake provider failed");
    }
    // Fault modes: `hold` waits `ms`, or less when the client goes away first.
    const gone = new AbortController();
    res.on("close", () => gone.abort());
    const hold = (ms: number) =>
      sleep(ms, undefined, { signal: AbortSignal.any([gone.signal, holds.signal]) }).then(
        () => undefined,
        () => undefined,
      );
    if (opts.resetBeforeHeaders === true) {
      res.socket?.destroy();
      return;
    }
    if (opts.stallBeforeHeadersMs !== undefined && opts.stallBeforeHeadersMs > 0) {
      await hold(opts.stallBeforeHeadersMs);
      if (res.destroyed) return;
    }
    const limit = positiveInt(request.max_completion_tokens) ?? positiveInt(request.max_tokens);
    const count =
      limit === undefined || opts.ignoreLimit === true ? opts.chunks : Math.min(opts.chunks, limit);
    let pieces =
      opts.answer?.(request)?.slice(0, limit ?? Infinity) ??
      Array.from({ length: count }, (_, i) => (i === 0 ? "word0" : ` word${i}`));
    const messages = request.messages as { role?: unknown; content?: unknown }[];
    const lastMessage = messages[messages.length - 1];
    const tools = Array.isArray(request.tools)
      ? (request.tools as { function?: { name?: unknown } }[])
      : [];
    // A tool call: the first tool's name and `toolArguments`, split in two pieces.
    const toolCall =
      opts.toolCalls === true && tools.length > 0 && lastMessage?.role !== "tool"
        ? {
            id: `call_fake${created + 1}`,
            name: String(tools[0]?.function?.name ?? "tool"),
            args: opts.toolArguments ?? '{"city":"Paris"}',
          }
        : undefined;
    if (opts.toolCalls === true && lastMessage?.role === "tool") {
      pieces = ["tool said ", String(lastMessage.content)];
    }
    const format = request.response_format as { type?: unknown } | undefined;
    if (format?.type === "json_schema" && opts.jsonSchema !== false)
      pieces = ['{"answer":', '"word0"}'];
    const finishReason =
      toolCall !== undefined
        ? "tool_calls"
        : limit !== undefined && limit < opts.chunks && opts.ignoreLimit !== true
          ? "length"
          : "stop";
    const logprobs = toolCall === undefined ? logprobEntries(opts, request, pieces) : undefined;
    const choices = opts.honourN === true ? (positiveInt(request.n) ?? 1) : 1;
    const indexes = Array.from({ length: choices }, (_, index) => index);
    const inflate = opts.inflateUsage;
    const usage = {
      prompt_tokens:
        inflate?.promptTimesCharacters === undefined
          ? (opts.usage?.prompt_tokens ?? promptTokens(request.messages))
          : inflate.promptTimesCharacters * promptCharacters(request.messages),
      completion_tokens:
        inflate?.outputLimit === true && limit !== undefined
          ? limit
          : (opts.usage?.completion_tokens ?? count * choices),
    };
    const usageObject = {
      ...usage,
      total_tokens: usage.prompt_tokens + usage.completion_tokens,
      ...(opts.usage?.prompt_tokens_details === undefined
        ? {}
        : { prompt_tokens_details: opts.usage.prompt_tokens_details }),
      ...(opts.usage?.completion_tokens_details === undefined
        ? {}
        : { completion_tokens_details: opts.usage.completion_tokens_details }),
    };
    const id = `chatcmpl-fake${++created}`;
    const createdAt = Math.floor(Date.now() / 1000);

    if (request.stream !== true) {
      if (opts.delayMs > 0) await sleep(opts.delayMs);
      if (opts.garbage === true) {
        const text = '{"id": "chatcmpl-broken", "choices": [<html>502 Bad Gateway</html>';
        res.writeHead(200, {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(text),
        });
        res.end(text);
        return;
      }
      return sendJson(res, 200, {
        id,
        object: "chat.completion",
        created: createdAt,
        model,
        choices: indexes.map((index) => ({
          index,
          message:
            toolCall === undefined
              ? { role: "assistant", content: pieces.join("") }
              : {
                  role: "assistant",
                  content: null,
                  tool_calls: [
                    {
                      id: toolCall.id,
                      type: "function",
                      function: { name: toolCall.name, arguments: toolCall.args },
                    },
                  ],
                },
          ...(logprobs === undefined ? {} : { logprobs: { content: logprobs } }),
          finish_reason: finishReason,
        })),
        ...(opts.omitUsage ? {} : { usage: usageObject }),
        ...opts.extraMembers,
      });
    }

    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
    });
    openStreams.add(res);
    res.on("close", () => openStreams.delete(res));
    if (opts.rawStream !== undefined) {
      res.socket?.setNoDelay(true);
      for (const piece of opts.rawStream) {
        if (res.destroyed) return;
        res.write(piece);
        streamedBytes += piece.byteLength;
        await new Promise((resolve) => setImmediate(resolve));
      }
      res.end();
      return;
    }
    if (opts.endless === true) {
      const filler = "x".repeat(Math.max(0, (opts.endlessChunkBytes ?? 1024) - 160));
      for (let i = 0; ; i++) {
        if (res.destroyed) return;
        const delta = { content: i === 0 ? filler : ` ${filler}` };
        const event = `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: createdAt, model, choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
        const flushed = res.write(event);
        streamedBytes += Buffer.byteLength(event);
        streamedChunks++;
        if (!flushed) {
          await new Promise<void>((resolve) => {
            const done = () => {
              res.off("drain", done);
              res.off("close", done);
              resolve();
            };
            res.on("drain", done);
            res.on("close", done);
          });
        } else if (i % 64 === 63) await new Promise((resolve) => setImmediate(resolve));
      }
    }
    const chunk = (choices: unknown[], extra: object = {}) => ({
      id,
      object: "chat.completion.chunk",
      created: createdAt,
      model,
      choices,
      ...extra,
    });
    const send = async (payload: unknown): Promise<boolean> => {
      if (res.destroyed) return false;
      const data =
        opts.garbage === true && payload !== "[DONE]"
          ? `{"broken": ${JSON.stringify(payload).slice(0, 20)} not json`
          : typeof payload === "string"
            ? payload
            : JSON.stringify(payload);
      res.write(`data: ${data}\n\n`);
      if (opts.delayMs > 0) await sleep(opts.delayMs);
      return !res.destroyed;
    };
    if (
      !(await send(
        chunk(
          indexes.map((index) => ({
            index,
            delta: { role: "assistant", content: "" },
            finish_reason: null,
          })),
        ),
      ))
    ) {
      return;
    }
    if (toolCall !== undefined) {
      const half = Math.floor(toolCall.args.length / 2);
      const calls = [
        { id: toolCall.id, type: "function", function: { name: toolCall.name, arguments: "" } },
        { function: { arguments: toolCall.args.slice(0, half) } },
        { function: { arguments: toolCall.args.slice(half) } },
      ];
      for (const call of calls) {
        const delta = { tool_calls: [{ index: 0, ...call }] };
        if (!(await send(chunk([{ index: 0, delta, finish_reason: null }])))) return;
      }
      pieces = [];
    }
    for (const [i, piece] of pieces.entries()) {
      if (opts.stallAfterChunks !== undefined && i >= opts.stallAfterChunks) {
        await hold(600_000);
        return;
      }
      if (opts.failMidStream && i >= opts.failAfterChunks) {
        res.socket?.destroy();
        return;
      }
      const deltas = indexes.map((index) => ({
        index,
        delta: { content: piece },
        ...(logprobs === undefined ? {} : { logprobs: { content: [logprobs[i]] } }),
        finish_reason: null,
      }));
      if (!(await send(chunk(deltas)))) {
        return;
      }
    }
    if (opts.failMidStream) {
      res.socket?.destroy();
      return;
    }
    const finals = indexes.map((index) => ({ index, delta: {}, finish_reason: finishReason }));
    if (!(await send(chunk(finals)))) return;
    const streamOptions = request.stream_options as { include_usage?: unknown } | undefined;
    if (streamOptions?.include_usage === true && !opts.omitUsage) {
      if (!(await send(chunk([], { usage: usageObject })))) return;
    }
    if (opts.omitDone !== true && !(await send("[DONE]"))) return;
    res.end();
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;

  let stopped: Promise<void> | undefined;
  return {
    get url() {
      return `http://127.0.0.1:${port}${options.basePath}`;
    },
    port,
    requests,
    calls: (path) => requests.filter((r) => r.path === path).length,
    setOptions(partial) {
      options = { ...options, ...partial };
    },
    releaseHolds() {
      holds.abort();
      holds = newHolds();
    },
    cutStreams() {
      const open = [...openStreams];
      for (const res of open) res.socket?.destroy();
      return open.length;
    },
    get connections() {
      return connections;
    },
    get closedConnections() {
      return closedConnections;
    },
    get streamedBytes() {
      return streamedBytes;
    },
    get streamedChunks() {
      return streamedChunks;
    },
    stop() {
      return (stopped ??= (async () => {
        const closing = new Promise<void>((resolve) => server.close(() => resolve()));
        // Waiting for every socket's "close" makes `closedConnections` final once this resolves.
        const open = [...sockets].map((s) => new Promise((resolve) => s.once("close", resolve)));
        for (const socket of sockets) socket.destroy();
        await Promise.all([closing, ...open]);
      })());
    },
  };
}

function sendJson(res: ServerResponse, status: number, payload: unknown): void {
  const text = JSON.stringify(payload);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}

function sendError(res: ServerResponse, status: number, code: string, message: string): void {
  sendJson(res, status, { error: { message, type: "invalid_request_error", code } });
}

function positiveInt(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value >= 1 ? value : undefined;
}

/** A stand-in for a tokenizer: one token per whitespace-separated word, at least one. */
/** Characters of the messages' string contents. */
function promptCharacters(messages: unknown[]): number {
  let characters = 0;
  for (const message of messages) {
    const content = (message as { content?: unknown } | null)?.content;
    if (typeof content === "string") characters += [...content].length;
  }
  return characters;
}

function promptTokens(messages: unknown[]): number {
  let words = 0;
  for (const message of messages) {
    const content = (message as { content?: unknown } | null)?.content;
    if (typeof content === "string") words += content.split(/\s+/).filter(Boolean).length;
  }
  return Math.max(words, 1);
}
