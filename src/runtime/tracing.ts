import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  type Attributes,
  type Span,
  type TextMapGetter,
  type Tracer,
} from "@opentelemetry/api";
import { ExportResultCode, W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, TracerProvider, type SpanExporter } from "@opentelemetry/sdk-trace";
import { ATTR_ERROR_TYPE, ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";
import type { Logger } from "pino";
import type { Config } from "../config.js";
import type { ChatInput, ChatStep, ChatTrace, ChatTracer } from "../domain/chat/ports.js";
import type { UsageFigures } from "../domain/chat/types.js";
import type { Closing } from "../domain/chat/metering.js";
import { GatewayError } from "../domain/errors.js";
import type { FlushResult, SettlementFlusher } from "../domain/settlement/index.js";

/**
 * Tracing (OpenTelemetry, off by default): one span per chat call and one per settlement batch,
 * exported over OTLP/HTTP (JSON) through a batch processor, so a request only records into
 * memory. The chat span follows the GenAI semantic conventions, plus the gateway's own
 * attributes (`gateway.*`). Nothing secret is ever an attribute: no API key, endpoint, token,
 * message or error text (errors as their code only).
 */

/**
 * GenAI attribute names. They are still "development" in the semantic conventions, whose
 * package advises copying such names rather than importing its incubating entry point (which
 * may rename them in a minor release).
 */
const genAi = {
  operationName: "gen_ai.operation.name",
  requestModel: "gen_ai.request.model",
  inputTokens: "gen_ai.usage.input_tokens",
  outputTokens: "gen_ai.usage.output_tokens",
  cachedInputTokens: "gen_ai.usage.cache_read.input_tokens",
  reasoningTokens: "gen_ai.usage.reasoning.output_tokens",
} as const;

export interface Tracing {
  readonly chat: ChatTracer;
  /** The flusher, its batches traced (one span each; dry runs and busy flushes are not). */
  traceFlusher(flusher: SettlementFlusher): SettlementFlusher;
  /** Exports the spans ended so far. */
  flush(): Promise<void>;
  /**
   * Exports what is left and stops (shutdown), for at most {@link shutdownExportMs}. Never
   * rejects: a collector that is away loses those spans, never delays or fails the shutdown's
   * other steps beyond that.
   */
  shutdown(): Promise<void>;
}

/** The longest a shutdown waits for the last spans' export (the exporter retries a collector that is away). */
export const shutdownExportMs = 2_000;

const headerGetter: TextMapGetter<{ get(name: string): string | null }> = {
  get: (carrier, key) => carrier.get(key) ?? undefined,
  keys: () => ["traceparent", "tracestate"],
};

/** Tracing from the configuration; undefined (off) without an OTLP endpoint. */
export function createTracing(
  config: Pick<Config, "otlpTracesEndpoint" | "otelServiceName">,
  logger: Logger,
): Tracing | undefined {
  const url = config.otlpTracesEndpoint;
  if (url === undefined) return undefined;
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: config.otelServiceName }),
    spanProcessors: [
      new BatchSpanProcessor({ exporter: reported(new OTLPTraceExporter({ url }), logger) }),
    ],
  });
  const tracer = provider.getTracer("model-market-gateway");
  const propagator = new W3CTraceContextPropagator();

  const chat: ChatTracer = {
    start(input: ChatInput): ChatTrace {
      // The caller's trace, when it sent a valid W3C traceparent.
      const parent =
        input.headers?.get("traceparent") == null
          ? ROOT_CONTEXT
          : propagator.extract(ROOT_CONTEXT, input.headers, headerGetter);
      const attributes: Attributes = { [genAi.operationName]: "chat" };
      if (input.dialect !== undefined) attributes["gateway.dialect"] = input.dialect;
      const span = tracer.startSpan("chat", { kind: SpanKind.SERVER, attributes }, parent);
      return chatTrace(span);
    },
  };

  return {
    chat,
    traceFlusher: (flusher) => tracedFlusher(tracer, flusher),
    flush: () => provider.forceFlush(),
    shutdown: async () => {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        provider.shutdown().catch(() => undefined),
        new Promise<void>((resolve) => (timer = setTimeout(resolve, shutdownExportMs))),
      ]);
      clearTimeout(timer);
    },
  };
}

/**
 * The exporter, its failures logged: once when exports start failing (spans are dropped until
 * the collector answers), once when they recover. The reason is the error's code or name only:
 * a collector's answer or URL may carry what the log must not.
 */
function reported(exporter: SpanExporter, logger: Logger): SpanExporter {
  let failing = false;
  return {
    export(spans, done) {
      exporter.export(spans, (result) => {
        if (result.code !== ExportResultCode.SUCCESS && !failing) {
          failing = true;
          const error = result.error as (Error & { code?: unknown }) | undefined;
          logger.warn(
            { spans: spans.length, reason: String(error?.code ?? error?.name ?? "failed") },
            "span export failed: spans are dropped until the collector answers",
          );
        } else if (result.code === ExportResultCode.SUCCESS && failing) {
          failing = false;
          logger.info("span export recovered");
        }
        done(result);
      });
    },
    shutdown: () => exporter.shutdown(),
    forceFlush: () => exporter.forceFlush?.() ?? Promise.resolve(),
  };
}

function chatTrace(span: Span): ChatTrace {
  let ended = false;
  return {
    request(model: string, stream: boolean) {
      const name = model.slice(0, 200);
      // `{gen_ai.operation.name} {gen_ai.request.model}`, as the conventions name the span.
      span.updateName(`chat ${name}`);
      span.setAttribute(genAi.requestModel, name);
      span.setAttribute("gateway.stream", stream);
    },
    step(step: ChatStep) {
      span.addEvent(step);
    },
    admitted(a) {
      span.addEvent("reserved");
      span.setAttributes({
        "gateway.request.id": a.requestId,
        "gateway.quote.id": a.quoteId,
        "gateway.offer.id": a.offerId,
        "gateway.permit.id": a.permitId,
        // Money as a decimal string, never a float.
        "gateway.charge.maximum_credits": a.maximumCredits.toString(),
      });
    },
    closed(closing: Closing) {
      const { usage } = closing;
      span.addEvent("closed");
      span.setAttributes({
        [genAi.inputTokens]: Number(usage.inputTokens),
        [genAi.outputTokens]: Number(usage.outputTokens),
        [genAi.cachedInputTokens]: Number(usage.cachedInputTokens ?? 0n),
        [genAi.reasoningTokens]: Number(usage.reasoningTokens ?? 0n),
        // The offer that answered (failover may have switched it since the reservation).
        "gateway.offer.id": closing.offerId,
        "gateway.charge.credits": closing.charge.toString(),
        "gateway.billing": closing.billing,
        "gateway.status": closing.status,
        "gateway.usage.source": closing.usageSource,
        // Both numbers (DESIGN.md section 10): gen_ai.usage.* above are what was charged.
        ...figureAttributes("claimed", closing.claimed),
        ...figureAttributes("counted", closing.counted),
      });
    },
    end(error?: unknown) {
      if (ended) return;
      ended = true;
      if (error !== undefined) {
        // The code only: a message may quote what the client sent.
        const code = error instanceof GatewayError ? error.code : "internal_error";
        span.setAttribute(ATTR_ERROR_TYPE, code);
        span.setStatus({ code: SpanStatusCode.ERROR, message: code });
      }
      span.end();
    },
  };
}

/**
 * A span per settlement batch a flush reports, spanning that flush (the batches of one flush
 * follow each other within it); a flush that throws is one error span.
 */
/**
 * `gateway.usage.<which>.{input,output,cache_read.input,reasoning.output}_tokens` of a claim or a
 * count, named as the GenAI conventions name the charged usage; none when there is none.
 */
function figureAttributes(
  which: "claimed" | "counted",
  figures: UsageFigures | undefined,
): Record<string, number> {
  if (figures === undefined) return {};
  return {
    [`gateway.usage.${which}.input_tokens`]: Number(figures.inputTokens),
    [`gateway.usage.${which}.output_tokens`]: Number(figures.outputTokens),
    [`gateway.usage.${which}.cache_read.input_tokens`]: Number(figures.cachedInputTokens),
    [`gateway.usage.${which}.reasoning.output_tokens`]: Number(figures.reasoningTokens),
  };
}

function tracedFlusher(tracer: Tracer, flusher: SettlementFlusher): SettlementFlusher {
  const traced = async (
    run: () => Promise<FlushResult | undefined>,
    dryRun: boolean,
  ): Promise<FlushResult | undefined> => {
    const startTime = Date.now();
    let result: FlushResult | undefined;
    try {
      result = await run();
    } catch (error) {
      const span = tracer.startSpan("settlement flush", { startTime });
      const code = error instanceof GatewayError ? error.code : "internal_error";
      span.setAttribute(ATTR_ERROR_TYPE, code);
      span.setStatus({ code: SpanStatusCode.ERROR, message: code });
      span.end();
      throw error;
    }
    if (dryRun || result === undefined) return result;
    for (const b of result.batches) {
      const span = tracer.startSpan("settlement batch", {
        startTime,
        attributes: {
          "gateway.settlement.batch_id": b.batchId,
          "gateway.settlement.status": b.status,
          "gateway.settlement.requests": b.requests,
          "gateway.settlement.charges": b.charges,
          "gateway.settlement.credits": b.credits.toString(),
          ...(b.txHash === undefined ? {} : { "gateway.settlement.tx_hash": b.txHash }),
          ...(b.gas === undefined ? {} : { "gateway.settlement.gas": b.gas.toString() }),
        },
      });
      if (b.status === "failed") span.setStatus({ code: SpanStatusCode.ERROR, message: "failed" });
      span.end();
    }
    return result;
  };
  return {
    account: flusher.account,
    flush: async (options) =>
      (await traced(() => flusher.flush(options), options?.dryRun === true)) as FlushResult,
    settleClosing: (signal) => traced(() => flusher.settleClosing(signal), false),
  };
}
