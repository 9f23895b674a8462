import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";

/**
 * The demo market's provider: a small OpenAI-compatible endpoint that echoes
 * the last user message back, word by word, with usage. It exists so that
 * `npm start` shows the whole product on one machine; it runs as a separate
 * HTTP server and the gateway reaches it only through provider registration,
 * like any real provider. It stays a chat completion server: what the
 * Responses and Messages dialects send it (system and developer messages, text
 * content parts, function tools, tool results, a JSON schema to answer in) is
 * the chat the gateway's translators make of them (DESIGN.md section 9). Offered
 * tools, it calls the first one with the user's words as `{"text": ...}`; given a
 * tool's result, it echoes that; asked for a JSON schema, it answers
 * `{"echo": ...}`.
 */
export interface DemoProvider {
  readonly url: string;
  readonly token: string;
  close(): Promise<void>;
}

interface ChatBody {
  model?: string;
  messages?: { role?: string; content?: unknown }[];
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  max_completion_tokens?: number;
  tools?: { type?: string; function?: { name?: string } }[];
  tool_choice?: unknown;
  response_format?: { type?: string };
}

/** A message's text: a string, or the text of its content parts. */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((part) =>
      typeof (part as { text?: unknown }).text === "string" ? (part as { text: string }).text : "",
    )
    .join(" ");
}

/** The tool to call: the first offered, unless the request says none or a tool answered last. */
function toolToCall(body: ChatBody): string | undefined {
  const last = body.messages?.at(-1);
  if (last?.role === "tool" || body.tool_choice === "none") return undefined;
  const name = body.tools?.find((t) => t.type === "function")?.function?.name;
  return typeof name === "string" ? name : undefined;
}

function replyText(body: ChatBody): string {
  const last = body.messages?.at(-1);
  if (last?.role === "tool") return `The tool said: ${textOf(last.content)}`;
  const user = [...(body.messages ?? [])].reverse().find((m) => m.role === "user");
  const text = textOf(user?.content);
  const format = body.response_format?.type;
  if (format === "json_schema" || format === "json_object") return JSON.stringify({ echo: text });
  return `You said: ${text}`;
}

function replyWords(body: ChatBody): string[] {
  const limit = body.max_completion_tokens ?? body.max_tokens ?? 64;
  const text = replyText(body);
  // A JSON answer stays whole (one piece per space would still join back to it).
  return text
    .split(/(?<= )/)
    .filter(Boolean)
    .slice(0, Math.max(1, limit));
}

function promptTokens(body: ChatBody): number {
  return Math.max(1, Math.ceil(JSON.stringify(body.messages ?? []).length / 4));
}

export async function startDemoProvider(
  models: readonly string[],
  host = "127.0.0.1",
): Promise<DemoProvider> {
  const token = `demo_${randomBytes(16).toString("hex")}`;
  const server = http.createServer((req, res) => {
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.headers.authorization !== `Bearer ${token}`) {
      req.resume();
      return send(401, { error: { message: "invalid token", type: "authentication_error" } });
    }
    if (req.method === "GET" && req.url === "/v1/models") {
      req.resume();
      return send(200, {
        object: "list",
        data: models.map((id) => ({ id, object: "model", owned_by: "demo" })),
      });
    }
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
      req.resume();
      return send(404, { error: { message: "not found", type: "invalid_request_error" } });
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      let body: ChatBody;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as ChatBody;
      } catch {
        return send(400, { error: { message: "invalid JSON", type: "invalid_request_error" } });
      }
      const id = `chatcmpl-${randomBytes(8).toString("hex")}`;
      const created = Math.floor(Date.now() / 1000);
      const words = replyWords(body);
      const tool = toolToCall(body);
      const call =
        tool === undefined
          ? undefined
          : {
              id: `call_${randomBytes(6).toString("hex")}`,
              type: "function",
              function: { name: tool, arguments: JSON.stringify({ text: words.join("").trim() }) },
            };
      const usage = {
        prompt_tokens: promptTokens(body),
        completion_tokens: words.length,
        total_tokens: promptTokens(body) + words.length,
      };
      const model = body.model ?? models[0] ?? "demo";
      if (!body.stream) {
        return send(200, {
          id,
          object: "chat.completion",
          created,
          model,
          choices: [
            call === undefined
              ? {
                  index: 0,
                  message: { role: "assistant", content: words.join("") },
                  finish_reason: "stop",
                }
              : {
                  index: 0,
                  message: { role: "assistant", content: null, tool_calls: [call] },
                  finish_reason: "tool_calls",
                },
          ],
          usage,
        });
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      const event = (data: unknown) => res.write(`data: ${JSON.stringify(data)}\n\n`);
      const chunk = (delta: object, finish: string | null) =>
        event({
          id,
          object: "chat.completion.chunk",
          created,
          model,
          choices: [{ index: 0, delta, finish_reason: finish }],
        });
      chunk({ role: "assistant", content: "" }, null);
      if (call === undefined) {
        for (const word of words) chunk({ content: word }, null);
        chunk({}, "stop");
      } else {
        chunk({ tool_calls: [{ index: 0, ...call }] }, null);
        chunk({}, "tool_calls");
      }
      if (body.stream_options?.include_usage) {
        event({ id, object: "chat.completion.chunk", created, model, choices: [], usage });
      }
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host}:${port}`,
    token,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
