import { BaseError } from "../../domain/base-error.js";
import { GatewayError } from "../../domain/errors.js";
import type { EndpointSecret, VerificationCheck } from "../../domain/health-types.js";
import type { UpstreamClient, UpstreamResponse } from "./http.js";

/**
 * What every verification step of the prober (probe.ts) shares: the request, the reading of a
 * JSON answer, and the failure that says whether the endpoint answered wrong or not at all.
 */

/** Largest answer read during verification (model lists can be long, completions are one token). */
export const maxVerificationBytes = 1024 * 1024;

export class CheckFailed extends BaseError {
  readonly reason = "verification_check_failed";
  override readonly name = "CheckFailed";
  constructor(
    readonly check: VerificationCheck,
    message: string,
    readonly transport = false,
  ) {
    super(message);
  }
}

/** No answer was had: the failure says nothing about whether the endpoint conforms. */
export function transportFailed(message: string): CheckFailed {
  return new CheckFailed("endpoint_unreachable", message, true);
}

/** Statuses that say "not now" (timeout, rate limit, server failure), not "not like this". */
function isTransportStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/** A non-success status: a transport failure, or a wrong answer failing `check`. */
export async function badStatus(
  response: UpstreamResponse,
  check: VerificationCheck,
  what: string,
): Promise<CheckFailed> {
  await response.dump();
  const message = `${what} answered HTTP ${response.status}`;
  return isTransportStatus(response.status)
    ? transportFailed(message)
    : new CheckFailed(check, message);
}

export async function send(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  path: string,
  body: unknown,
  timeoutMs: number,
  what: string,
): Promise<{ response: UpstreamResponse; signal: AbortSignal }> {
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const response = await upstream.request(endpoint, path, {
      method: body === undefined ? "GET" : "POST",
      headers:
        body === undefined
          ? { accept: "application/json" }
          : { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      timeoutMs,
    });
    return { response, signal };
  } catch (err) {
    throw transportFailed(`${what} failed: ${reason(err, signal, timeoutMs)}`);
  }
}

/** A completion the checks ask for: `POST /v1/chat/completions` with `body`. */
export function sendCompletion(
  upstream: UpstreamClient,
  endpoint: EndpointSecret,
  body: unknown,
  timeoutMs: number,
  what: string,
): Promise<{ response: UpstreamResponse; signal: AbortSignal }> {
  return send(upstream, endpoint, "/v1/chat/completions", body, timeoutMs, what);
}

export async function readJson(
  response: UpstreamResponse,
  signal: AbortSignal,
  timeoutMs: number,
  check: VerificationCheck,
  what: string,
): Promise<unknown> {
  let text: string;
  try {
    text = await response.text(maxVerificationBytes);
  } catch (err) {
    // Cut off or timed out while reading: no complete answer to judge.
    throw transportFailed(`${what}: ${reason(err, signal, timeoutMs)}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new CheckFailed(check, `${what}: the answer is not valid JSON`);
  }
}

export function isUsage(value: unknown): boolean {
  return (
    isObject(value) && isTokenCount(value.prompt_tokens) && isTokenCount(value.completion_tokens)
  );
}

function isTokenCount(value: unknown): boolean {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function firstHeader(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** Why a step failed, in words that never name the endpoint. */
export function reason(err: unknown, signal: AbortSignal, timeoutMs: number): string {
  if (signal.aborted) return `no complete answer within ${timeoutMs} ms`;
  // GatewayErrors from the upstream client are written not to contain the endpoint.
  if (err instanceof GatewayError) return err.message;
  return "unexpected error";
}
