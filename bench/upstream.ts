import http from "node:http";
import type { AddressInfo } from "node:net";
import { SLOW_STREAM_USER, STREAM_CONTENT_CHUNKS, announceReady, serveControl } from "./child.js";
import { cjkChunks, compactJson, proseChunks } from "./lib/agent-texts.js";

/**
 * The benchmark's fake provider: as fast an OpenAI-compatible endpoint as plain `node:http`
 * allows, so the figures measure the gateway, not the model. It runs as its own process.
 *
 * - `GET /v1/models` lists `BENCH_MODELS` (default the demo market's `demo-chat,demo-coder`).
 * - `POST /v1/chat/completions` answers a small `chat.completion` with `usage`, or with
 *   `"stream": true` exactly 20 content chunks, a finish chunk, a usage chunk when
 *   `stream_options.include_usage` is set, and `data: [DONE]`, all written at once; unless the
 *   request's `"user"` is `"bench-slow-stream"` (SLOW_STREAM_USER): then the first content chunk
 *   goes at once, the others one every `SLOW_STREAM_MS` / 20 ms (default 10,000 / 20 = 500), and
 *   the finish, usage and `[DONE]` one tick after the last, so the stream lasts `SLOW_STREAM_MS`.
 *
 * `npm run bench:agent`'s requests (issue 35) are marked by their `"user"` too (AGENT_USERS):
 * `bench-agent` answers as above; `bench-cjk` answers 1,000 Chinese characters without a space
 * (20 chunks of 50 when streamed), `bench-prose` English prose of about as many tokens, `bench-json` about 6 KB of compact JSON (20 slices when
 * streamed). For these three the prompt claim is a character count / 8, well under any count
 * of the gateway's (an 8,000-token prompt at / 4 could claim above it and be judged diverged).
 *
 * Usage: `completion_tokens` never exceeds the request's output limit (`max_completion_tokens`,
 * else `max_tokens`), so a gateway that caps over-reported usage has nothing to cap.
 * Authorization is not checked (the gateway presents its endpoint token, the proxy forwards the
 * client's header; neither should cost the upstream anything).
 */

const models = (process.env.BENCH_MODELS ?? "demo-chat,demo-coder")
  .split(",")
  .map((m) => m.trim())
  .filter(Boolean);
const host = process.env.HOST ?? "127.0.0.1";
const port = Number(process.env.PORT ?? "0");
const slowStreamMs = Number(process.env.SLOW_STREAM_MS ?? "10000");

const jsonWords = ["Hello", "from", "the", "benchmark", "upstream."];

interface ChatBody {
  model?: unknown;
  messages?: unknown;
  stream?: unknown;
  stream_options?: { include_usage?: unknown } | null;
  max_tokens?: unknown;
  max_completion_tokens?: unknown;
  user?: unknown;
}

const modelList = Buffer.from(
  JSON.stringify({
    object: "list",
    data: models.map((id) => ({ id, object: "model", created: 0, owned_by: "bench" })),
  }),
);

let counter = 0;

/** The hard answers of `npm run bench:agent`, by the request's `"user"` (the content chunks). */
const hardAnswers: Record<string, string[]> = {
  "bench-cjk": cjkChunks(STREAM_CONTENT_CHUNKS, 50),
  "bench-prose": proseChunks(STREAM_CONTENT_CHUNKS, 45),
  "bench-json": ((text: string) => {
    const size = Math.ceil(text.length / STREAM_CONTENT_CHUNKS);
    return Array.from({ length: STREAM_CONTENT_CHUNKS }, (_, i) =>
      text.slice(i * size, (i + 1) * size),
    );
  })(compactJson(6000)),
};
const agentUsers = new Set(["bench-agent", ...Object.keys(hardAnswers)]);

function outputLimit(body: ChatBody): number {
  const limit = body.max_completion_tokens ?? body.max_tokens;
  return typeof limit === "number" && Number.isInteger(limit) && limit > 0 ? limit : Infinity;
}

function promptTokens(body: ChatBody): number {
  const divisor = typeof body.user === "string" && agentUsers.has(body.user) ? 8 : 4;
  return Math.max(1, Math.ceil(JSON.stringify(body.messages ?? []).length / divisor));
}

function sendJson(res: http.ServerResponse, status: number, payload: Buffer | string): void {
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
  });
  res.end(payload);
}

function errorBody(message: string, type: string): string {
  return JSON.stringify({ error: { message, type } });
}

function answer(res: http.ServerResponse, raw: Buffer): void {
  let body: ChatBody;
  try {
    body = JSON.parse(raw.toString("utf8")) as ChatBody;
  } catch {
    return sendJson(res, 400, errorBody("invalid JSON", "invalid_request_error"));
  }
  const id = `chatcmpl-bench-${(++counter).toString(36)}`;
  const created = Math.floor(Date.now() / 1000);
  const model = typeof body.model === "string" ? body.model : (models[0] ?? "bench");
  const limit = outputLimit(body);
  const prompt = promptTokens(body);
  const hard = typeof body.user === "string" ? hardAnswers[body.user] : undefined;

  if (body.stream !== true && hard) {
    const completion = Math.min(limit, STREAM_CONTENT_CHUNKS);
    return sendJson(
      res,
      200,
      JSON.stringify({
        id,
        object: "chat.completion",
        created,
        model,
        choices: [
          {
            index: 0,
            message: { role: "assistant", content: hard.join("") },
            finish_reason: "stop",
          },
        ],
        usage: {
          prompt_tokens: prompt,
          completion_tokens: completion,
          total_tokens: prompt + completion,
        },
      }),
    );
  }
  if (body.stream !== true) {
    const words = jsonWords.slice(0, Math.min(limit, jsonWords.length));
    const completion = words.length;
    return sendJson(
      res,
      200,
      JSON.stringify({
        id,
        object: "chat.completion",
        created,
        model,
        choices: [
          {
            index: 0,
            message: { role: "assistant", content: words.join(" ") },
            finish_reason: completion < jsonWords.length ? "length" : "stop",
          },
        ],
        usage: {
          prompt_tokens: prompt,
          completion_tokens: completion,
          total_tokens: prompt + completion,
        },
      }),
    );
  }

  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
  });
  const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":0,"delta":`;
  const content = (i: number): string =>
    hard
      ? `data: ${head}{${i === 0 ? '"role":"assistant",' : ""}"content":${JSON.stringify(hard[i])}},"finish_reason":null}]}\n\n`
      : i === 0
        ? `data: ${head}{"role":"assistant","content":"tok0"},"finish_reason":null}]}\n\n`
        : `data: ${head}{"content":" tok${i}"},"finish_reason":null}]}\n\n`;
  const completion = Math.min(limit, STREAM_CONTENT_CHUNKS);
  const finish = (): void => {
    res.write(
      `data: ${head}{},"finish_reason":"${completion < STREAM_CONTENT_CHUNKS ? "length" : "stop"}"}]}\n\n`,
    );
    if (body.stream_options?.include_usage === true) {
      res.write(
        `data: ${JSON.stringify({
          id,
          object: "chat.completion.chunk",
          created,
          model,
          choices: [],
          usage: {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
          },
        })}\n\n`,
      );
    }
    res.end("data: [DONE]\n\n");
  };

  if (body.user === SLOW_STREAM_USER) {
    // A slow model: the first token at once, then one every slowStreamMs / 20.
    let sent = 0;
    res.write(content(sent++));
    const timer = setInterval(() => {
      if (sent < STREAM_CONTENT_CHUNKS) return void res.write(content(sent++));
      clearInterval(timer);
      finish();
    }, slowStreamMs / STREAM_CONTENT_CHUNKS);
    res.on("close", () => clearInterval(timer));
    return;
  }
  // Each content chunk is its own write, as a real provider's tokens would be.
  for (let i = 0; i < STREAM_CONTENT_CHUNKS; i++) res.write(content(i));
  finish();
}

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const path = req.url?.split("?")[0];
  if (req.method === "GET" && path === "/v1/models") {
    req.resume();
    return sendJson(res, 200, modelList);
  }
  if (req.method === "POST" && path === "/v1/chat/completions") {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => answer(res, Buffer.concat(chunks)));
    return;
  }
  req.resume();
  sendJson(res, 404, errorBody("not found", "invalid_request_error"));
});
server.headersTimeout = 65_000;

server.listen(port, host, () => {
  const { port: actual } = server.address() as AddressInfo;
  announceReady("upstream", `http://${host}:${actual}`);
});

serveControl(
  () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
);
