import { InferenceService } from "../../../gen/gateway/v1/inference_pb.js";
import { GatewayError } from "../../domain/errors.js";
import { Hex32 } from "../../schema/common.js";
import { PermitReceiptList, SignedUsageReceipt } from "../views/receipts.js";
import { permitBalanceResource, requestResource, settlementOfRequest } from "../views/resources.js";
import type { Route } from "../route-kit.js";
import { usageReceiptView } from "../views/challenges.js";

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

export const inferenceRoutes: readonly Route[] = [
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
