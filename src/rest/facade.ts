import type { connectNodeAdapter } from "@connectrpc/connect-node";
import { createClient, type Client, type Transport } from "@connectrpc/connect";
import type { Logger } from "pino";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { ModelStatusSchema, OfferStatusSchema } from "../../gen/gateway/v1/market_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import { GatewayError } from "../domain/errors.js";
import { readJson, readJsonBytes, type NodeRequest } from "./body.js";
import { relayChat } from "./chat.js";
import { toHttpError } from "./errors.js";
import {
  flushView,
  modelView,
  offerHealthView,
  offerView,
  parseStatusFilter,
  permitBalanceView,
  quoteView,
  requestView,
  typedDataView,
} from "./views.js";

/** The response type connect-node's handlers take (HTTP/1.1 or HTTP/2). */
export type NodeResponse = Parameters<ReturnType<typeof connectNodeAdapter>>[1];

export interface Readiness {
  readonly ok: boolean;
  readonly checks: Record<string, { ok: boolean; error?: string }>;
}

export interface FacadeDeps {
  /** Reaches the RPC services in process, through the same interceptors as the network. */
  readonly transport: Transport;
  readonly bodyLimitBytes: number;
  readonly readiness: () => Promise<Readiness>;
  readonly logger: Logger;
}

interface Clients {
  catalog: Client<typeof CatalogService>;
  quote: Client<typeof QuoteService>;
  inference: Client<typeof InferenceService>;
  provider: Client<typeof ProviderService>;
  settlement: Client<typeof SettlementService>;
}

interface Call {
  readonly req: NodeRequest;
  readonly res: NodeResponse;
  readonly url: URL;
  readonly params: readonly string[];
  /** Call options that carry the caller's credentials and request id to the RPC. */
  readonly options: { headers: Record<string, string>; signal: AbortSignal };
  readonly clients: Clients;
  readonly deps: FacadeDeps;
}

interface Reply {
  readonly status?: number;
  readonly body: unknown;
  readonly headers?: Record<string, string>;
}

interface Route {
  readonly method: string;
  readonly path: RegExp;
  readonly handle: (call: Call) => Promise<Reply | undefined>;
}

const id = "([^/]+)";

const statusOf = <T extends number>(
  schema: Parameters<typeof parseStatusFilter>[0],
  url: URL,
): T | undefined => {
  const word = url.searchParams.get("status");
  const value = parseStatusFilter<T>(schema, word);
  if (word !== null && word !== "" && value === undefined) {
    throw new GatewayError("invalid_request", `unknown status filter '${word.slice(0, 40)}'`);
  }
  return value;
};

/**
 * The OpenAI-compatible REST surface. Each route translates HTTP into one RPC
 * call and its answer back into the spec's JSON; no business rule lives here.
 */
const routes: Route[] = [
  {
    method: "GET",
    path: /^\/health$/,
    handle: async () => ({ body: { status: "ok" } }),
  },
  {
    method: "GET",
    path: /^\/ready$/,
    handle: async ({ deps }) => {
      const readiness = await deps.readiness();
      return {
        status: readiness.ok ? 200 : 503,
        body: { status: readiness.ok ? "ready" : "unavailable", checks: readiness.checks },
      };
    },
  },
  {
    method: "GET",
    path: /^\/v1\/models$/,
    handle: async ({ clients, options, url }) => {
      const { models } = await clients.catalog.listModels(
        { status: statusOf(ModelStatusSchema, url) },
        options,
      );
      return { body: { object: "list", data: models.map(modelView) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/models/${id}$`),
    handle: async ({ clients, options, params }) => {
      const { model, offers } = await clients.catalog.getModel({ id: params[0] }, options);
      if (model === undefined) throw new Error("GetModel answered without a model");
      return { body: { ...modelView(model), offers: offers.map(offerView) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/models/${id}/offers$`),
    handle: async ({ clients, options, params, url }) => {
      const { offers } = await clients.catalog.listOffers(
        { model: params[0], status: statusOf(OfferStatusSchema, url) },
        options,
      );
      return { body: { object: "list", data: offers.map(offerView) } };
    },
  },
  {
    method: "POST",
    path: /^\/v1\/quotes$/,
    handle: async ({ clients, options, req, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      const { quote } = await clients.quote.createQuote({ body }, options);
      if (quote === undefined) throw new Error("CreateQuote answered without a quote");
      return { body: quoteView(quote) };
    },
  },
  {
    method: "POST",
    path: /^\/v1\/chat\/completions$/,
    handle: async ({ clients, options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      await relayChat(clients.inference, req, res, body, options);
      return undefined;
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/requests/${id}$`),
    handle: async ({ clients, options, params }) => {
      const { request } = await clients.inference.getRequest({ id: params[0] }, options);
      if (request === undefined) throw new Error("GetRequest answered without a record");
      return { body: requestView(request) };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/permits/${id}$`),
    handle: async ({ clients, options, params }) => {
      const { permit } = await clients.inference.getPermit({ permitId: params[0] }, options);
      if (permit === undefined) throw new Error("GetPermit answered without a permit");
      return { body: permitBalanceView(permit) };
    },
  },
  {
    method: "POST",
    path: /^\/v1\/provider-offers\/challenge$/,
    handle: async ({ clients, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes));
      const { typedData } = await clients.provider.createRegistrationChallenge(
        {
          offerId: stringField(body, "offerId", true),
          endpointUrl: stringField(body, "endpointUrl", true),
          nonce: stringField(body, "nonce", false),
          expiresAt: integerField(body, "expiresAt", false),
        },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: typedDataView(typedData) };
    },
  },
  {
    method: "POST",
    path: /^\/v1\/provider-offers\/register$/,
    handle: async ({ clients, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes));
      const { offer } = await clients.provider.registerEndpoint(
        {
          offerId: stringField(body, "offerId", true),
          endpointUrl: stringField(body, "endpointUrl", true),
          nonce: stringField(body, "nonce", true),
          expiresAt: integerField(body, "expiresAt", true),
          signature: stringField(body, "signature", true),
          endpointToken: stringField(body, "endpointToken", false),
        },
        options,
      );
      if (offer === undefined) throw new Error("registration answered without an offer");
      return { body: { offer: offerView(offer) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/provider-offers/${id}/health$`),
    handle: async ({ clients, options, params }) => {
      const { health } = await clients.provider.getOfferHealth({ offerId: params[0] }, options);
      if (health === undefined) throw new Error("health answered without a health record");
      return { body: offerHealthView(health) };
    },
  },
  {
    method: "POST",
    path: new RegExp(`^/v1/provider-offers/${id}/verify$`),
    handle: async ({ clients, options, params, req }) => {
      req.resume(); // the spec's verify takes no body
      const { offer } = await clients.provider.verifyOffer({ offerId: params[0] }, options);
      if (offer === undefined) throw new Error("verify answered without an offer");
      return { body: { offer: offerView(offer) } };
    },
  },
  {
    method: "POST",
    path: /^\/settlements\/flush$/,
    handle: async ({ clients, options, req, deps }) => {
      const parsed = await readJson(req, deps.bodyLimitBytes);
      const body = parsed.value === undefined ? {} : objectBody(parsed);
      const maxRequests = body.maxRequests ?? body.max_requests;
      if (
        maxRequests !== undefined &&
        maxRequests !== null &&
        (typeof maxRequests !== "number" ||
          !Number.isSafeInteger(maxRequests) ||
          maxRequests < 1 ||
          maxRequests > 0xffffffff)
      ) {
        throw new GatewayError("invalid_request", "'maxRequests' must be a positive integer");
      }
      const dryRun = body.dryRun ?? body.dry_run;
      if (dryRun !== undefined && dryRun !== null && typeof dryRun !== "boolean") {
        throw new GatewayError("invalid_request", "'dryRun' must be a boolean");
      }
      const response = await clients.settlement.flush(
        {
          ...(typeof maxRequests === "number" ? { maxRequests } : {}),
          dryRun: dryRun === true,
        },
        options,
      );
      return { body: flushView(response) };
    },
  },
];

/** The JSON body as an object (400 for anything else). */
function objectBody(parsed: { value: unknown }): Record<string, unknown> {
  const value = parsed.value;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new GatewayError("invalid_request", "the request body must be a JSON object");
  }
  return value as Record<string, unknown>;
}

function stringField(body: Record<string, unknown>, name: string, required: boolean): string {
  const value = body[name];
  if (value === undefined || value === null) {
    if (required) throw new GatewayError("invalid_request", `'${name}' is required`);
    return "";
  }
  if (typeof value !== "string")
    throw new GatewayError("invalid_request", `'${name}' must be a string`);
  return value;
}

function integerField(body: Record<string, unknown>, name: string, required: true): bigint;
function integerField(
  body: Record<string, unknown>,
  name: string,
  required: false,
): bigint | undefined;
function integerField(
  body: Record<string, unknown>,
  name: string,
  required: boolean,
): bigint | undefined {
  const value = body[name];
  if (value === undefined || value === null) {
    if (required) throw new GatewayError("invalid_request", `'${name}' is required`);
    return undefined;
  }
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new GatewayError("invalid_request", `'${name}' must be an integer (Unix seconds)`);
  }
  return BigInt(value);
}

function decodePathParam(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new GatewayError("invalid_request", "malformed percent-encoding in the path");
  }
}

function sendJson(
  res: NodeResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
    ...headers,
  });
  res.end(payload);
}

export function createRestFacade(deps: FacadeDeps): (req: NodeRequest, res: NodeResponse) => void {
  const clients: Clients = {
    catalog: createClient(CatalogService, deps.transport),
    quote: createClient(QuoteService, deps.transport),
    inference: createClient(InferenceService, deps.transport),
    provider: createClient(ProviderService, deps.transport),
    settlement: createClient(SettlementService, deps.transport),
  };

  return (req, res) => {
    const url = new URL(req.url ?? "/", "http://gateway.invalid");
    const abort = new AbortController();
    // Only a client that left before the answer ended cancels the call (an abort builds an
    // AbortError with a stack trace: not something to pay for on every finished request).
    res.once("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const headers: Record<string, string> = {};
    for (const name of ["authorization", "x-request-id"]) {
      const value = req.headers[name];
      if (typeof value === "string") headers[name] = value;
    }

    const handled = (async (): Promise<void> => {
      let match: { route: Route; params: string[] } | undefined;
      let pathKnown = false;
      for (const route of routes) {
        const m = route.path.exec(url.pathname);
        if (m === null) continue;
        pathKnown = true;
        if (route.method === req.method) {
          match = { route, params: m.slice(1).map(decodePathParam) };
          break;
        }
      }
      if (match === undefined) {
        req.resume();
        throw pathKnown
          ? new GatewayError(
              "method_not_allowed",
              `${req.method} is not allowed on ${url.pathname}`,
            )
          : new GatewayError(
              "route_not_found",
              `no route for ${req.method} ${url.pathname.slice(0, 200)}`,
            );
      }
      const reply = await match.route.handle({
        req,
        res,
        url,
        params: match.params,
        options: { headers, signal: abort.signal },
        clients,
        deps,
      });
      if (reply !== undefined && !res.headersSent)
        sendJson(res, reply.status ?? 200, reply.body, reply.headers);
    })();

    handled.catch((error: unknown) => {
      const { status, body } = toHttpError(error);
      if (status >= 500 && body.error.code === "internal_error")
        deps.logger
          .child({ reqId: headers["x-request-id"] })
          .error({ err: error, path: url.pathname }, "request failed");
      if (res.headersSent) {
        res.end();
        return;
      }
      const extra: Record<string, string> = {};
      if (status === 401) extra["www-authenticate"] = "Bearer";
      sendJson(res, status, body, extra);
    });
  };
}
