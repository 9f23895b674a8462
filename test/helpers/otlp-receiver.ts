import { createServer, type Server } from "node:http";
import { gunzipSync } from "node:zlib";

/** A span as the OTLP/HTTP JSON exporter sent it, its attributes as plain values. */
export interface ReceivedSpan {
  readonly serviceName: string | undefined;
  readonly name: string;
  readonly kind: number;
  readonly traceId: string;
  readonly spanId: string;
  readonly parentSpanId: string | undefined;
  readonly status: { readonly code?: number; readonly message?: string };
  readonly attributes: Record<string, string | number | boolean>;
  readonly events: string[];
}

interface AnyValue {
  stringValue?: string;
  intValue?: number | string;
  doubleValue?: number;
  boolValue?: boolean;
}
interface KeyValue {
  key: string;
  value: AnyValue;
}
interface ExportRequest {
  resourceSpans?: {
    resource?: { attributes?: KeyValue[] };
    scopeSpans?: {
      spans?: {
        name: string;
        kind: number;
        traceId: string;
        spanId: string;
        parentSpanId?: string;
        status?: { code?: number; message?: string };
        attributes?: KeyValue[];
        events?: { name: string }[];
      }[];
    }[];
  }[];
}

function plain(attributes: KeyValue[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const { key, value } of attributes ?? []) {
    if (value.stringValue !== undefined) out[key] = value.stringValue;
    else if (value.intValue !== undefined) out[key] = Number(value.intValue);
    else if (value.doubleValue !== undefined) out[key] = value.doubleValue;
    else if (value.boolValue !== undefined) out[key] = value.boolValue;
  }
  return out;
}

/**
 * An OTLP/HTTP trace receiver on 127.0.0.1:0: a real `node:http` server that decodes what the
 * exporter POSTs to `/v1/traces` (JSON, gzip or not) and keeps every span.
 */
export async function startOtlpReceiver(): Promise<{
  /** The base URL (OTEL_EXPORTER_OTLP_ENDPOINT). */
  readonly url: string;
  readonly spans: ReceivedSpan[];
  /** Every request body's content type seen. */
  readonly contentTypes: string[];
  stop(): Promise<void>;
}> {
  const spans: ReceivedSpan[] = [];
  const contentTypes: string[] = [];
  const server: Server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (part: Buffer) => parts.push(part));
    req.on("end", () => {
      if (req.method !== "POST" || req.url !== "/v1/traces") {
        res.writeHead(404).end();
        return;
      }
      contentTypes.push(req.headers["content-type"] ?? "");
      let body = Buffer.concat(parts);
      if (req.headers["content-encoding"] === "gzip") body = gunzipSync(body);
      const request = JSON.parse(body.toString("utf8")) as ExportRequest;
      for (const rs of request.resourceSpans ?? []) {
        const serviceName = plain(rs.resource?.attributes)["service.name"];
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) {
            spans.push({
              serviceName: typeof serviceName === "string" ? serviceName : undefined,
              name: s.name,
              kind: s.kind,
              traceId: s.traceId,
              spanId: s.spanId,
              parentSpanId: s.parentSpanId === "" ? undefined : s.parentSpanId,
              status: s.status ?? {},
              attributes: plain(s.attributes),
              events: (s.events ?? []).map((e) => e.name),
            });
          }
        }
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    contentTypes,
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
