import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Hex } from "viem";
import {
  GetPermitResponseSchema,
  GetRequestReceiptResponseSchema,
  GetRequestResponseSchema,
  InferenceService,
  ListPermitReceiptsResponseSchema,
} from "../../gen/gateway/v1/inference_pb.js";
import type { RequestRecord } from "../domain/requests.js";
import { GatewayError } from "../domain/errors.js";
import type { ChatSink, Inference } from "../domain/chat/index.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import { readPermitBalance, type PermitLedger } from "../domain/permit-balance.js";
import { readPermit, type PermitReader } from "../domain/permits.js";
import { requireAuthority } from "../domain/permit-authorization/index.js";
import { buildUsageReceipt, type ReceiptSigner } from "../domain/receipts.js";
import { answerBridge } from "./chat-bridge.js";
import {
  getUsage,
  listPermits,
  listRequests,
  permitBalanceMessage,
  type InferenceActivityDeps,
} from "./inference-activity.js";
import { callerKey, type Caller } from "./context.js";
import {
  chatInputOf,
  type ChatFields,
  eventToMessage,
  receiptMessage,
  requestMessage,
  settlementMessage,
} from "./inference-messages.js";

export interface InferenceServiceDeps {
  readonly inference: Inference;
  /** The record of a request made with `apiKeyId` (undefined for another key's request). */
  readonly findRequest: (id: string, apiKeyId: string) => Promise<RequestRecord | undefined>;
  /** Permits read live from the chain (the cached reader chat requests use). */
  readonly permits: PermitReader;
  /** The gateway's ledger of a permit (zeros when it has none). */
  readonly permitLedger: (permitId: Hex) => Promise<PermitLedger>;
  /** Unix seconds. */
  readonly clock: () => number;
  /**
   * Unix seconds a permit's expiry is judged by (`PermitClock.now`: the later of `clock` and the
   * chain's latest block time the gateway has seen); default `clock`.
   */
  readonly permitClock?: () => number;
  /** A key's requests, usage and authorizations (ListRequests, GetUsage, ListPermits). */
  readonly activity: InferenceActivityDeps;
  /** Usage receipts; absent: the receipt RPCs answer `receipts_unavailable`. */
  readonly receipts?: InferenceReceiptDeps;
}

export interface InferenceReceiptDeps {
  /** Absent when this gateway has no receipt key (RECEIPT_PRIVATE_KEY). */
  readonly signer: ReceiptSigner | undefined;
  /** The typed-data domain's chain and market. */
  readonly chainId: number;
  readonly market: Hex;
  /** A permit's charged records in the order they closed (adapters/pg/requests.ts). */
  readonly listCharged: (
    permitId: Hex,
    limit: number,
    startingAfter: string | undefined,
  ) => Promise<RequestRecord[]>;
}

/** Receipts per page of ListPermitReceipts: the default and the most. */
export const receiptPage = { default: 50, max: 100 } as const;
/** Signatures made in a row before the list yields to the event loop (a signature is ~1 ms). */
const signaturesPerSlice = 8;

function callerOf(ctx: HandlerContext): Caller {
  const caller = ctx.values.get(callerKey);
  if (caller === undefined) throw new GatewayError("missing_api_key", "missing API key");
  return caller;
}

function apiKeyOf(ctx: HandlerContext): string {
  return callerOf(ctx).apiKeyId;
}

function receiptSigner(receipts: InferenceReceiptDeps | undefined): {
  deps: InferenceReceiptDeps;
  signer: ReceiptSigner;
} {
  if (receipts?.signer === undefined) {
    throw new GatewayError(
      "receipts_unavailable",
      "this gateway has no receipt key configured (RECEIPT_PRIVATE_KEY): it signs no receipts",
    );
  }
  return { deps: receipts, signer: receipts.signer };
}

/**
 * The request `id` names, as the caller may read it: the record's rule is only the key that made
 * the request, and another key's looks absent.
 */
async function callersRequest(deps: InferenceServiceDeps, rawId: string, ctx: HandlerContext) {
  if (!isHex32(rawId)) throw new GatewayError("invalid_hex", "request id must be a Hex32");
  const id = normalizeHex(rawId);
  // Read your writes: an answer this process just gave may still be recording its charge.
  await deps.inference.whenRecorded(id);
  const record = await deps.findRequest(id, apiKeyOf(ctx));
  if (record === undefined)
    throw new GatewayError("request_not_found", `request ${rawId} does not exist`);
  return record;
}

const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * The InferenceService: the RPCs, and `chatInto`, the one body of the chat method. The
 * server-streaming RPC pulls it through the bridge (chat-bridge.ts); the REST chat routes call it
 * with their own sink (src/rest/chat.ts), the guard's context the same as an RPC's.
 */
export interface InferenceServiceImpl extends ServiceImpl<typeof InferenceService> {
  /**
   * One chat call for the caller the guard admitted (`ctx.values`), its answer pushed to `sink`
   * (`ChatSink`, src/domain/chat/types.ts, is the contract). Settles when the call is over;
   * rejects only with a failure after `completed`.
   */
  chatInto(request: ChatFields, ctx: HandlerContext, sink: ChatSink): Promise<void>;
}

export function createInferenceService(deps: InferenceServiceDeps): InferenceServiceImpl {
  const chatInto = (request: ChatFields, ctx: HandlerContext, sink: ChatSink): Promise<void> =>
    deps.inference.chatInto(
      chatInputOf(callerOf(ctx), request, ctx.signal, ctx.requestHeader),
      sink,
    );
  return {
    chatInto,

    async *streamChatCompletion(req, ctx) {
      const stream = answerBridge(
        (signal, sink) => chatInto(req, { ...ctx, signal }, sink),
        ctx.signal,
      );
      for await (const event of stream) {
        if (event.type !== "failed") yield eventToMessage(event);
      }
    },

    async getRequest(req, ctx) {
      const record = await callersRequest(deps, req.id, ctx);
      return create(GetRequestResponseSchema, { request: requestMessage(record) });
    },

    async getRequestReceipt(req, ctx) {
      const { deps: receipts, signer } = receiptSigner(deps.receipts);
      const record = await callersRequest(deps, req.id, ctx);
      const signed = await signer.sign(
        buildUsageReceipt(record, { chainId: receipts.chainId, market: receipts.market }),
      );
      return create(GetRequestReceiptResponseSchema, {
        receipt: receiptMessage(signed.receipt),
        signature: signed.signature,
        signer: signed.signer,
      });
    },

    async listPermitReceipts(req, ctx) {
      const { deps: receipts, signer } = receiptSigner(deps.receipts);
      const { authority } = callerOf(ctx);
      if (!isHex32(req.permitId))
        throw new GatewayError("invalid_hex", "the permit id must be a Hex32");
      if (req.startingAfter !== "" && !isHex32(req.startingAfter))
        throw new GatewayError("invalid_hex", "starting_after must be a request id (Hex32)");
      if (req.limit > receiptPage.max)
        throw new GatewayError("invalid_request", `limit must be 1 to ${receiptPage.max}`);
      const permitId = normalizeHex(req.permitId);
      // Who may list is who may see the balance (GetPermit): keys the payer authorized, judged
      // from memory on the permit read from the chain, before the database is asked.
      const permit = await readPermit(deps.permits, permitId);
      requireAuthority(authority, permit, deps.clock());
      const limit = req.limit === 0 ? receiptPage.default : req.limit;
      let records: RequestRecord[];
      try {
        records = await receipts.listCharged(
          permitId,
          limit + 1,
          req.startingAfter === "" ? undefined : normalizeHex(req.startingAfter),
        );
      } catch (err) {
        throw new GatewayError("database_unavailable", "the receipts could not be read", {
          cause: err,
        });
      }
      const page = records.slice(0, limit);
      const out = [];
      for (let i = 0; i < page.length; i++) {
        // A page signs up to `max` receipts: in slices, so chats on this process are not held
        // up behind it.
        if (i > 0 && i % signaturesPerSlice === 0) await yieldToEventLoop();
        const record = page[i]!;
        const signed = await signer.sign(
          buildUsageReceipt(record, { chainId: receipts.chainId, market: receipts.market }),
        );
        out.push({
          receipt: receiptMessage(signed.receipt),
          signature: signed.signature,
          signer: signed.signer,
          settlement: settlementMessage(record),
        });
      }
      return create(ListPermitReceiptsResponseSchema, {
        receipts: out,
        hasMore: records.length > limit,
      });
    },

    listRequests: (req, ctx) => listRequests(deps, callerOf(ctx), req),

    getUsage: (req, ctx) => getUsage(deps, callerOf(ctx), req),

    listPermits: (_req, ctx) => listPermits(deps, callerOf(ctx)),

    async getPermit(req, ctx) {
      const { authority } = callerOf(ctx);
      const now = deps.clock();
      // Only keys the payer authorized see the balance (DESIGN.md section 4), checked from
      // memory before the ledger is read.
      // Spendability by the chain's time as well as ours, as admission judges it.
      const balance = await readPermitBalance(req.permitId, {
        permits: deps.permits,
        ledger: deps.permitLedger,
        now: deps.permitClock === undefined ? now : Math.max(now, deps.permitClock()),
        authorize: (permit) => requireAuthority(authority, permit, now),
      });
      return create(GetPermitResponseSchema, { permit: permitBalanceMessage(balance) });
    },
  };
}
