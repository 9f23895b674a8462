import type { ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import {
  codeToHttpStatus,
  contentTypeStreamRegExp,
  endStreamFlag,
  endStreamToJson,
  errorToJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import {
  contentTypeRegExp as grpcContentType,
  setTrailerStatus,
} from "@connectrpc/connect/protocol-grpc";
import {
  parseContentType as parseGrpcWebContentType,
  trailerFlag,
  trailerSerialize,
} from "@connectrpc/connect/protocol-grpc-web";
import type { NodeRequest } from "../rest/body.js";
import type { NodeResponse } from "../rest/body.js";

function nodeHeaders(headers: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  headers.forEach((value, key) => (out[key] = value));
  return out;
}

/**
 * Answers an RPC with `error` before its body is read (src/server.ts: credentials checked first),
 * in its protocol's own form, as connect-node would: gRPC's status in trailers, gRPC-Web's in a
 * trailer frame, a Connect stream's in its end-of-stream message, a Connect unary call (or
 * anything else) as its HTTP status with the JSON error. The body is left unread (drained).
 */
export function writeRpcRefusal(req: NodeRequest, res: NodeResponse, error: ConnectError): void {
  req.resume();
  const type = req.headers["content-type"] ?? "";
  const grpcWeb = parseGrpcWebContentType(type);
  if (grpcWeb !== undefined && !grpcWeb.text) {
    const trailer = trailerSerialize(setTrailerStatus(new Headers(), error));
    res.writeHead(200, { "content-type": type });
    res.end(encodeEnvelope(trailerFlag, trailer));
  } else if (grpcContentType.test(type)) {
    res.writeHead(200, { "content-type": type });
    res.addTrailers(nodeHeaders(setTrailerStatus(new Headers(), error)));
    res.end();
  } else if (contentTypeStreamRegExp.test(type)) {
    const end = JSON.stringify(endStreamToJson(error.metadata, error, undefined));
    res.writeHead(200, { "content-type": type });
    res.end(encodeEnvelope(endStreamFlag, new TextEncoder().encode(end)));
  } else {
    const body = errorToJsonBytes(error, undefined);
    res.writeHead(codeToHttpStatus(error.code), {
      ...nodeHeaders(error.metadata),
      "content-type": "application/json",
      "content-length": String(body.byteLength),
    });
    res.end(body);
  }
}
