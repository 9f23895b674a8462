import type { Logger } from "pino";
import type { Config } from "../config.js";
import type { Tracing } from "../runtime/tracing.js";

/**
 * The process's tracing, when OTLP export is configured; undefined otherwise. The OpenTelemetry
 * SDK is imported only then: loaded, it is about a sixth of the gateway's memory at rest.
 */
export async function startTracing(config: Config, logger: Logger): Promise<Tracing | undefined> {
  if (config.otlpTracesEndpoint === undefined) return undefined;
  const { createTracing } = await import("../runtime/tracing.js");
  return createTracing(config, logger.child({ component: "tracing" }));
}
