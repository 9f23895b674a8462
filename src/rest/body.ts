import type { connectNodeAdapter } from "@connectrpc/connect-node";
import { checkJsonBounds, parseJsonText, type JsonBounds } from "../domain/chat/request/index.js";
import { GatewayError } from "../domain/errors.js";

/** The request type connect-node's handlers take (HTTP/1.1 or HTTP/2). */
export type NodeRequest = Parameters<ReturnType<typeof connectNodeAdapter>>[0];

/** The response type connect-node's handlers take (HTTP/1.1 or HTTP/2). */
export type NodeResponse = Parameters<ReturnType<typeof connectNodeAdapter>>[1];

/** Reads the raw body, refusing more than `limit` bytes with 413 `request_too_large`. */
export async function readBody(req: NodeRequest, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? "0");
  if (declared > limit) {
    req.resume();
    throw new GatewayError("request_too_large", `request body exceeds ${limit} bytes`);
  }
  // Events, not `for await`: the stream's async iterator builds an AbortError (stack trace
  // included) when it finishes, on every request. The listeners are the methods of one object,
  // so that `off()` takes every one of them away together.
  return new Promise<Buffer>((resolve, reject) => {
    if (req.destroyed) {
      reject(new GatewayError("invalid_request", "the request body was cut short"));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const on = {
      data(chunk: Buffer) {
        size += chunk.length;
        if (size > limit) {
          on.off();
          req.resume();
          reject(new GatewayError("request_too_large", `request body exceeds ${limit} bytes`));
          return;
        }
        chunks.push(chunk);
      },
      end() {
        on.off();
        resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
      },
      error(error: Error) {
        on.off();
        reject(error);
      },
      close() {
        on.off();
        reject(new GatewayError("invalid_request", "the request body was cut short"));
      },
      off() {
        req.off("data", on.data);
        req.off("end", on.end);
        req.off("error", on.error);
        req.off("close", on.close);
      },
    };
    req.on("data", on.data);
    req.on("end", on.end);
    req.on("error", on.error);
    req.on("close", on.close);
  });
}

function requireJsonType(req: NodeRequest): void {
  const type = req.headers["content-type"];
  if (type !== undefined && !/^application\/([\w.+-]*\+)?json\b/i.test(type)) {
    req.resume();
    throw new GatewayError("unsupported_media_type", "the request body must be application/json");
  }
}

/**
 * The raw bytes of a JSON body, for services that parse it themselves (chat, quotes: the client's
 * own bytes go upstream), by the same rule (`parseJsonText`, in the domain, for the RPC alike).
 */
export async function readJsonBytes(req: NodeRequest, limit: number): Promise<Buffer> {
  requireJsonType(req);
  return readBody(req, limit);
}

/**
 * Reads a JSON body. Checks only that it is JSON of the expected media type, within `bounds`
 * (MAX_JSON_DEPTH, MAX_JSON_ARRAY_ITEMS; 400 `invalid_request`, checked on the bytes before
 * parsing), under the one JSON text rule every body is read by (`parseJsonText`: strict UTF-8,
 * no byte order mark): what the document must contain is the services' business.
 */
export async function readJson(
  req: NodeRequest,
  limit: number,
  bounds?: JsonBounds,
): Promise<{ raw: Buffer; value: unknown }> {
  requireJsonType(req);
  const raw = await readBody(req, limit);
  if (raw.length === 0) return { raw, value: undefined };
  checkJsonBounds(raw, bounds);
  return { raw, value: parseJsonText(raw) };
}
