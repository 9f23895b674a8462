import type { DescEnum } from "@bufbuild/protobuf";
import {
  InferenceService,
  RequestStatusSchema,
  UsageBucketSchema,
} from "../../../gen/gateway/v1/inference_pb.js";
import { GatewayError } from "../../domain/errors.js";
import { Hex32 } from "../../schema/common.js";
import { PermitReceiptList, SignedUsageReceipt } from "../views/receipts.js";
import { permitBalanceResource, requestResource, settlementOfRequest } from "../views/resources.js";
import type { Route } from "../route-kit.js";
import { usageReceiptView } from "../views/challenges.js";
import { RequestList, SpendablePermitList, usageResource } from "../views/activity.js";
import { enumWord, enumWords } from "../views/proto-view.js";

/** The InferenceService routes besides chat: request records, their receipts, permits. */

/** `?limit=&starting_after=` of the receipts list (400 `invalid_request` on a bad limit). */
function receiptsPage(query: string): { limit: number; startingAfter: string } {
  const params = new URLSearchParams(query);
  const limit = params.get("limit");
  if (limit !== null && !/^[1-9]\d{0,2}$/.test(limit))
    throw new GatewayError("invalid_request", "'limit' must be an integer from 1 to 100");
  return {
    limit: limit === null ? 0 : Number(limit),
    startingAfter: params.get("starting_after") ?? "",
  };
}

/** A query parameter of Unix seconds (400 `invalid_request` when it is not one). */
function seconds(params: URLSearchParams, name: string): bigint | undefined {
  const value = params.get(name);
  if (value === null) return undefined;
  if (!/^\d{1,15}$/.test(value))
    throw new GatewayError("invalid_request", `'${name}' must be Unix seconds`);
  return BigInt(value);
}

/** An enum's value by its word (`completed` -> REQUEST_STATUS_COMPLETED); 0 when absent. */
function enumParam(params: URLSearchParams, name: string, schema: DescEnum): number {
  const value = params.get(name);
  if (value === null) return 0;
  const words = enumWords(schema);
  const match = schema.values.find((v) => v.number !== 0 && enumWord(schema, v.number) === value);
  if (match === undefined)
    throw new GatewayError("invalid_request", `'${name}' must be one of ${words.join(", ")}`);
  return match.number;
}

const timeParam = (name: string, description: string) => ({
  name,
  in: "query" as const,
  required: false,
  description,
  schema: { type: "integer", minimum: 0 },
});

export const inferenceRoutes: readonly Route[] = [
  {
    method: "GET",
    path: "/v1/requests",
    operationId: "listRequests",
    summary:
      "The records of the caller's requests, newest first (an API key's, or the x402 requests of the payer who signs)",
    description: [
      "Every request made with the calling API key (a payer's `ReadPayerRequests` signature,",
      "`Authorization: Payer ...`: the requests it paid with x402), newest first (`created_at`,",
      "then `id`), each as `GET /v1/requests/{id}` shows it. No other key's request appears.",
      "Filters: `model`, `permit`, `status`, `created_after` (at or after) and `created_before`",
      "(before), Unix seconds. Pages: `limit` (1 to 100, default 50) and `starting_after` (the",
      "last `id` of the previous page); `has_more` says whether another page follows.",
    ].join("\n"),
    tag: "inference",
    auth: "apiKeyOrPayer",
    parameters: [
      {
        name: "limit",
        in: "query",
        required: false,
        description: "records per page, 1 to 100 (default 50)",
        schema: { type: "integer", minimum: 1, maximum: 100 },
      },
      {
        name: "starting_after",
        in: "query",
        required: false,
        description: "the last id of the previous page",
        schema: Hex32,
      },
      {
        name: "model",
        in: "query",
        required: false,
        description: "only requests for this model",
        schema: { type: "string" },
      },
      {
        name: "permit",
        in: "query",
        required: false,
        description: "only requests paid from this permit",
        schema: Hex32,
      },
      {
        name: "status",
        in: "query",
        required: false,
        description: "only requests in this state",
        schema: { type: "string", enum: enumWords(RequestStatusSchema) },
      },
      timeParam("created_after", "Unix seconds: only requests made at or after this"),
      timeParam("created_before", "Unix seconds: only requests made before this"),
    ],
    answer: { description: "The records", schema: RequestList },
    errors: { 400: ["invalid_hex", "invalid_request"] },
    handle: async ({ unary, query }) => {
      const params = new URLSearchParams(query);
      const { requests, hasMore } = await unary(InferenceService.method.listRequests, {
        ...receiptsPage(query),
        model: params.get("model") ?? "",
        permitId: params.get("permit") ?? "",
        status: enumParam(params, "status", RequestStatusSchema),
        createdAfter: seconds(params, "created_after"),
        createdBefore: seconds(params, "created_before"),
      });
      return {
        body: {
          object: "list",
          data: requests.map((r) => requestResource.view(r)),
          has_more: hasMore,
        },
      };
    },
  },
  {
    method: "GET",
    path: "/v1/usage",
    operationId: "getUsage",
    summary:
      "Requests, tokens and credits by hour or day, model and offer (the caller's, or a permit's)",
    description: [
      "The usage of the requests made in `[from, to)` (Unix seconds; default the 7 days up to",
      "now), grouped by UTC `bucket` (`hour` or `day`, the default) of their creation, model and",
      "offer: requests, tokens charged, the providers' claims and the gateway's counts, credits",
      "charged (base units). Of the calling API key's requests (a payer's signature: its x402",
      "requests), or with `permit` of every request on that permit whichever key made it (API",
      "keys the permit's payer authorized; others are refused as `GET /v1/permits/{id}`). A range",
      "spans at most 93 days by day, 7 days by hour (400 `invalid_request`).",
    ].join("\n"),
    tag: "inference",
    auth: "apiKeyOrPayer",
    parameters: [
      {
        name: "bucket",
        in: "query",
        required: false,
        description: "the groups' time bucket (default day)",
        schema: { type: "string", enum: ["hour", "day"] },
      },
      {
        name: "permit",
        in: "query",
        required: false,
        description: "the permit whose usage (default: the caller's requests)",
        schema: Hex32,
      },
      timeParam("from", "Unix seconds: requests made at or after this (default to - 7 days)"),
      timeParam("to", "Unix seconds: requests made before this (default: now included)"),
    ],
    answer: { description: "The usage", schema: usageResource.schema },
    errors: {
      400: ["invalid_hex", "invalid_request"],
      402: ["permit_not_found"],
      403: ["permit_not_authorized"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, query }) => {
      const params = new URLSearchParams(query);
      const usage = await unary(InferenceService.method.getUsage, {
        bucket: enumParam(params, "bucket", UsageBucketSchema),
        permitId: params.get("permit") ?? "",
        from: seconds(params, "from"),
        to: seconds(params, "to"),
      });
      return { body: usageResource.view(usage) };
    },
  },
  {
    method: "GET",
    path: "/v1/permits",
    operationId: "listPermits",
    summary: "The permits the API key may spend, with their balances",
    description: [
      "Each permit an active authorization of the calling key names, with its balance as",
      "`GET /v1/permits/{id}` gives it (a permit the chain does not hold is left out), and",
      "`every_permit_payers`: the payers who authorized the key for every permit of theirs,",
      "whose permits are listed too (the newest 100 each opened, as the indexer saw them).",
    ].join("\n"),
    tag: "inference",
    answer: { description: "The permits", schema: SpendablePermitList },
    errors: { 503: ["chain_unavailable"] },
    handle: async ({ unary }) => {
      const { permits, everyPermitPayers } = await unary(InferenceService.method.listPermits, {});
      return {
        body: {
          object: "list",
          data: permits.map((p) => permitBalanceResource.view(p)),
          every_permit_payers: everyPermitPayers,
        },
      };
    },
  },
  {
    method: "GET",
    path: "/v1/requests/{id}",
    operationId: "getRequest",
    summary:
      "Get an inference request record (only the API key that made it, or the payer who paid it with x402)",
    tag: "inference",
    auth: "apiKeyOrPayer",
    pathId: { description: "request id (X-Gateway-Request-Id)", schema: Hex32 },
    answer: { description: "The record", schema: requestResource.schema },
    errors: { 400: ["invalid_hex"], 404: ["request_not_found"] },
    handle: async ({ unary, params }) => {
      const { request } = await unary(InferenceService.method.getRequest, { id: params[0] });
      if (request === undefined) throw new Error("GetRequest answered without a record");
      return { body: requestResource.view(request) };
    },
  },
  {
    method: "GET",
    path: "/v1/requests/{id}/receipt",
    operationId: "getRequestReceipt",
    summary:
      "The signed usage receipt of a request (only the API key that made it, or the payer who paid it with x402)",
    auth: "apiKeyOrPayer",
    description: [
      "EIP-712 `UsageReceipt` typed data over the request's closed record, wallet-ready",
      "(`eth_signTypedData_v4`; ethers' `verifyTypedData` without the `EIP712Domain` entry), and",
      "the gateway's receipt key's signature over it; `signer` is the address `GET /v1/gateway`",
      "publishes. Signed from the durable record when asked (deterministic: the same record,",
      "the same signature). A request paid with x402 is read with the payer's signature",
      "(`Authorization: Payer ...`, the `payerSignature` scheme) instead of a key.",
      "Another key's (or payer's) request is 404 `request_not_found`, as the record;",
      "an open request 409 `request_not_closed`; one closed without a charge (void) 404",
      "`receipt_not_found`; a gateway without a receipt key 503 `receipts_unavailable`.",
    ].join("\n"),
    tag: "inference",
    pathId: { description: "request id (X-Gateway-Request-Id)", schema: Hex32 },
    answer: { description: "The signed receipt", schema: SignedUsageReceipt },
    errors: {
      400: ["invalid_hex"],
      404: ["request_not_found", "receipt_not_found"],
      409: ["request_not_closed"],
      503: ["receipts_unavailable"],
    },
    handle: async ({ unary, params }) => {
      const answer = await unary(InferenceService.method.getRequestReceipt, { id: params[0] });
      if (answer.receipt === undefined) throw new Error("GetRequestReceipt answered no receipt");
      return {
        body: {
          receipt: usageReceiptView(answer.receipt),
          signature: answer.signature,
          signer: answer.signer,
        },
      };
    },
  },
  {
    method: "GET",
    path: "/v1/permits/{id}",
    operationId: "getPermit",
    summary: "A permit's balance (API keys the permit's payer authorized)",
    tag: "inference",
    pathId: { description: "permit id", schema: Hex32 },
    answer: { description: "The balance", schema: permitBalanceResource.schema },
    errors: {
      400: ["invalid_hex"],
      402: ["permit_not_found"],
      403: ["permit_not_authorized"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, params }) => {
      const { permit } = await unary(InferenceService.method.getPermit, { permitId: params[0] });
      if (permit === undefined) throw new Error("GetPermit answered without a permit");
      return { body: permitBalanceResource.view(permit) };
    },
  },
  {
    method: "GET",
    path: "/v1/permits/{id}/receipts",
    operationId: "listPermitReceipts",
    summary: "The signed usage receipts of a permit (API keys the permit's payer authorized)",
    description: [
      "Every charged request of the permit, whichever API key made it, in the order they closed,",
      "each as `GET /v1/requests/{id}/receipt` signs it, with its settlement: `status` and",
      "`batch_id`, the settlement batch that settled the charge (or is settling it). What settled",
      "on chain for the permit is the sum of the `charge` of its `settled` receipts",
      "(`gateway permit audit`). Pages: `limit` (1 to 100, default 50) and `starting_after` (the",
      "last `requestId` of the previous page); `has_more` says whether another page follows.",
    ].join("\n"),
    tag: "inference",
    pathId: { description: "permit id", schema: Hex32 },
    parameters: [
      {
        name: "limit",
        in: "query",
        required: false,
        description: "receipts per page, 1 to 100 (default 50)",
        schema: { type: "integer", minimum: 1, maximum: 100 },
      },
      {
        name: "starting_after",
        in: "query",
        required: false,
        description: "the last requestId of the previous page",
        schema: Hex32,
      },
    ],
    answer: { description: "The receipts", schema: PermitReceiptList },
    errors: {
      400: ["invalid_hex", "invalid_request"],
      402: ["permit_not_found"],
      403: ["permit_not_authorized"],
      503: ["chain_unavailable", "receipts_unavailable"],
    },
    handle: async ({ unary, params, query }) => {
      const page = receiptsPage(query);
      const { receipts, hasMore } = await unary(InferenceService.method.listPermitReceipts, {
        permitId: params[0],
        ...page,
      });
      return {
        body: {
          object: "list",
          data: receipts.map((r) => ({
            object: "usage_receipt",
            receipt: usageReceiptView(r.receipt!),
            signature: r.signature,
            signer: r.signer,
            settlement: settlementOfRequest.view(r.settlement ?? {}),
          })),
          has_more: hasMore,
        },
      };
    },
  },
];
