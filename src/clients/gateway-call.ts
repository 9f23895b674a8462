import { BaseError } from "../domain/base-error.js";
import { gatewayUrlProblem } from "./gateway-url.js";

/**
 * One call of the gateway's public REST API from the wallet tools (the provider and payer
 * CLIs, the dev sandbox): JSON in and out, the spec's error body as a {@link GatewayRequestError}.
 */
export interface GatewayConnection {
  readonly baseUrl: string;
  /** Absent: a call whose only credential is a signature in its body (a payer's own calls). */
  readonly apiKey?: string;
}

/** An error answer of the gateway, with the spec's code. */
export class GatewayRequestError extends BaseError {
  readonly reason = "gateway_refused";
  override readonly name = "GatewayRequestError";
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** GATEWAY_URL is `http://` to another machine (or no http(s) URL): nothing was sent. */
export class InsecureGatewayUrlError extends BaseError {
  readonly reason = "gateway_url_insecure";
  override readonly name = "InsecureGatewayUrlError";
}

/**
 * The gateway answered a redirect. Redirects are never followed: the API key and the payer's
 * signature go to GATEWAY_URL and nowhere else.
 */
export class GatewayRedirectError extends BaseError {
  readonly reason = "gateway_redirected";
  override readonly name = "GatewayRedirectError";
  constructor(
    readonly status: number,
    method: string,
    path: string,
  ) {
    super(
      `the gateway answered ${method} ${path.split("?")[0]} with a redirect (HTTP ${status}); ` +
        "redirects are not followed: set GATEWAY_URL to the address that answers itself",
    );
  }
}

/**
 * One JSON request to the gateway's REST API; an error answer throws {@link GatewayRequestError}.
 * The URL must be `https://` or loopback `http://` ({@link InsecureGatewayUrlError}, before
 * anything is sent); a redirect is not followed ({@link GatewayRedirectError}).
 */
export async function call<T>(
  gateway: GatewayConnection,
  method: string,
  path: string,
  body?: unknown,
): Promise<T> {
  const problem = gatewayUrlProblem(gateway.baseUrl);
  if (problem !== undefined) throw new InsecureGatewayUrlError(problem);
  const res = await fetch(new URL(path, gateway.baseUrl), {
    method,
    redirect: "manual",
    headers: {
      ...(gateway.apiKey === undefined ? {} : { authorization: `Bearer ${gateway.apiKey}` }),
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.status >= 300 && res.status < 400) {
    await res.body?.cancel();
    throw new GatewayRedirectError(res.status, method, path);
  }
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text === "" ? undefined : JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (!res.ok) {
    const error = (parsed as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new GatewayRequestError(
      res.status,
      error?.code ?? "http_error",
      error?.message ?? `HTTP ${res.status}`,
    );
  }
  return parsed as T;
}
