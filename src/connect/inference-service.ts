import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Hex } from "viem";
import {
  Billing,
  ChatChunkSchema,
  ChatCompletedSchema,
  ChatStartedSchema,
  type ChatCompleted,
  Dialect,
  GetPermitResponseSchema,
  GetRequestReceiptResponseSchema,
  GetRequestResponseSchema,
  InferenceService,
  ListPermitReceiptsResponseSchema,
  MeteringSchema,
  PermitState,
  RequestStatus,
  SettlementStatus,
  StreamChatCompletionResponseSchema,
  type Metering as MeteringMessageShape,
  type RequestSettlement,
  type StreamChatCompletionResponse,
  InferenceRequestSchema,
  type InferenceRequest,
  type UsageFigures as UsageFiguresMessage,
  type UsageReceiptFigures,
  type UsageReceiptTypedData as UsageReceiptTypedDataMessage,
  UsageSource as UsageSourceMessage,
} from "../../gen/gateway/v1/inference_pb.js";
import type { RequestRecord } from "../adapters/pg/requests.js";
import { GatewayError } from "../domain/errors.js";
import type {
  ChatCompleted as DomainChatCompleted,
  ChatEvent,
  ChatInput,
  Inference,
  Metering,
  UsageFigures,
  UsageSource,
} from "../domain/chat/index.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import { readPermitBalance, type PermitLedger } from "../domain/permit-balance.js";
import type { Permit, PermitReader } from "../domain/permits.js";
import { requireAuthority } from "../domain/permit-authorization.js";
import {
  buildUsageReceipt,
  type ReceiptSigner,
  type UsageReceiptTypedData,
} from "../domain/receipts.js";
import { callerKey, type Caller } from "./context.js";

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

/** The chat RPC's dialect -> the translator stage's name (undefined: a chat completion). */
export function dialectName(dialect: Dialect): "responses" | "messages" | undefined {
  switch (dialect) {
    case Dialect.RESPONSES:
      return "responses";
    case Dialect.MESSAGES:
      return "messages";
    default:
      return undefined;
  }
}

export const billingToProto = {
  billed: Billing.BILLED,
  partial: Billing.PARTIAL,
  void: Billing.VOID,
} as const;

export const usageSourceToProto: Record<UsageSource, UsageSourceMessage> = {
  provider: UsageSourceMessage.PROVIDER,
  gateway: UsageSourceMessage.GATEWAY,
};

/** A claim or a count as the RPC carries it; absent stays absent (unset message field). */
export function figuresMessage(
  figures: UsageFigures | null | undefined,
): UsageFiguresMessage | undefined {
  if (figures === null || figures === undefined) return undefined;
  return {
    $typeName: "gateway.v1.UsageFigures",
    inputTokens: figures.inputTokens,
    outputTokens: figures.outputTokens,
    cachedInputTokens: figures.cachedInputTokens,
    reasoningTokens: figures.reasoningTokens,
  };
}

function callerOf(ctx: HandlerContext): Caller {
  const caller = ctx.values.get(callerKey);
  if (caller === undefined) throw new GatewayError("missing_api_key", "missing API key");
  return caller;
}

function apiKeyOf(ctx: HandlerContext): string {
  return callerOf(ctx).apiKeyId;
}

/**
 * A chunk's metering as a message, its credits priced and written when read: a network call reads
 * them to send them; the REST facade, in process, reads only the chunk's bytes, so the chunks it
 * relays cost no pricing. (Only a scalar can be a getter: protobuf-es takes a message field that
 * is not an own property for unset.)
 */
class MeteringMessage implements MeteringMessageShape {
  readonly $typeName = MeteringSchema.typeName;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  private text: string | undefined;

  constructor(private readonly meter: Metering) {
    this.inputTokens = meter.inputTokens;
    this.outputTokens = meter.outputTokens;
  }

  // Kept once made: serialising reads it twice (whether it is set, then its value).
  get credits(): string {
    return (this.text ??= this.meter.credits.toString());
  }
}

/**
 * Domain events -> stream messages (one message per event, in order). The messages are written
 * out whole rather than made by create(), whose reflection over the schema costs more than the
 * rest of relaying a chunk in process; the types check that no field is left out.
 */
export function eventToMessage(
  event: Exclude<ChatEvent, { type: "failed" }>,
): StreamChatCompletionResponse {
  switch (event.type) {
    case "started":
      return {
        $typeName: StreamChatCompletionResponseSchema.typeName,
        event: {
          case: "started",
          value: {
            $typeName: ChatStartedSchema.typeName,
            requestId: event.requestId,
            quoteId: event.quoteId,
            offerId: event.offerId,
            tariffVersion: event.tariffVersion.toString(),
            maximumCredits: event.maximumCredits.toString(),
            stream: event.stream,
            replayed: event.replayed,
          },
        },
      };
    case "chunk":
      return {
        $typeName: StreamChatCompletionResponseSchema.typeName,
        event: {
          case: "chunk",
          value: {
            $typeName: ChatChunkSchema.typeName,
            data: event.data,
            metering: new MeteringMessage(event.metering),
            event: event.event ?? "",
          },
        },
      };
    case "completed":
      return {
        $typeName: StreamChatCompletionResponseSchema.typeName,
        event: { case: "completed", value: completedMessage(event) },
      };
  }
}

/** A completed answer as the RPC's ChatCompleted message (also what `x_gateway` is a view of). */
export function completedMessage(event: DomainChatCompleted): ChatCompleted {
  return {
    $typeName: ChatCompletedSchema.typeName,
    requestId: event.requestId,
    quoteId: event.quoteId,
    offerId: event.offerId,
    tariffVersion: event.tariffVersion.toString(),
    inputTokens: event.inputTokens,
    outputTokens: event.outputTokens,
    creditsCharged: event.creditsCharged.toString(),
    billing: billingToProto[event.billing],
    usageFromProvider: event.usageFromProvider,
    cachedInputTokens: event.cachedInputTokens ?? 0n,
    reasoningTokens: event.reasoningTokens ?? 0n,
    usageClaimed: figuresMessage(event.claimed),
    usageCounted: figuresMessage(event.counted),
    usageSource: usageSourceToProto[event.usageFromProvider ? "provider" : "gateway"],
  };
}

const statusToProto: Record<string, RequestStatus> = {
  pending: RequestStatus.PENDING,
  streaming: RequestStatus.STREAMING,
  completed: RequestStatus.COMPLETED,
  failed: RequestStatus.FAILED,
  cancelled: RequestStatus.CANCELLED,
};

const permitStateToProto = {
  open: PermitState.OPEN,
  closing: PermitState.CLOSING,
  closed: PermitState.CLOSED,
} as const;

const settlementToProto: Record<string, SettlementStatus> = {
  unsettled: SettlementStatus.UNSETTLED,
  settling: SettlementStatus.SETTLING,
  settled: SettlementStatus.SETTLED,
  none: SettlementStatus.NONE,
  unsettleable: SettlementStatus.UNSETTLEABLE,
};

function settlementMessage(record: RequestRecord): Omit<RequestSettlement, "$typeName"> {
  return {
    status: settlementToProto[record.settlementStatus] ?? SettlementStatus.UNSPECIFIED,
    batchId: record.batchId ?? "",
    txHash: record.txHash ?? "",
    settledAt: record.settledAt === null ? undefined : BigInt(record.settledAt),
    reason: record.settlementReason ?? "",
  };
}

/** A request's record as the RPC (and, through its view, REST) shows it. */
export function requestMessage(record: RequestRecord): InferenceRequest {
  return create(InferenceRequestSchema, {
    id: record.id,
    model: record.model,
    modelId: record.modelId,
    offerId: record.offerId,
    permitId: record.permitId,
    quoteId: record.quoteId,
    stream: record.stream,
    status: statusToProto[record.status] ?? RequestStatus.UNSPECIFIED,
    inputTokens: record.inputTokens,
    outputTokens: record.outputTokens,
    cachedInputTokens: record.cachedInputTokens,
    reasoningTokens: record.reasoningTokens,
    usageClaimed: figuresMessage(record.claimed),
    usageCounted: figuresMessage(record.counted),
    usageSource:
      record.usageSource === null
        ? UsageSourceMessage.UNSPECIFIED
        : usageSourceToProto[record.usageSource],
    maximumCredits: record.maximumCredits.toString(),
    creditsCharged: (record.creditsCharged ?? 0n).toString(),
    tariffVersion: record.tariffVersion.toString(),
    billing: record.billing === null ? Billing.UNSPECIFIED : billingToProto[record.billing],
    error: record.error ?? "",
    createdAt: BigInt(record.createdAt),
    completedAt: record.completedAt === null ? undefined : BigInt(record.completedAt),
    settlement: settlementMessage(record),
  });
}

function receiptMessage(
  receipt: UsageReceiptTypedData,
): Omit<UsageReceiptTypedDataMessage, "$typeName"> {
  const m = receipt.message;
  return {
    domain: {
      $typeName: "gateway.v1.TypedDataDomain",
      name: receipt.domain.name,
      version: receipt.domain.version,
      chainId: BigInt(receipt.domain.chainId),
      verifyingContract: receipt.domain.verifyingContract,
    },
    types: Object.entries(receipt.types).map(([name, fields]) => ({
      $typeName: "gateway.v1.TypedDataType",
      name,
      fields: fields.map((f) => ({ $typeName: "gateway.v1.TypedDataField", ...f })),
    })),
    primaryType: receipt.primaryType,
    message: {
      $typeName: "gateway.v1.UsageReceiptMessage",
      requestId: m.requestId,
      permitId: m.permitId,
      offerId: m.offerId,
      modelId: m.modelId,
      tariffVersion: BigInt(m.tariffVersion),
      inputTokens: BigInt(m.inputTokens),
      outputTokens: BigInt(m.outputTokens),
      cachedTokens: BigInt(m.cachedTokens),
      reasoningTokens: BigInt(m.reasoningTokens),
      charge: m.charge,
      billing: m.billing,
      closedAt: BigInt(m.closedAt),
      usageSource: m.usageSource,
      claimed: receiptFigures(m.claimed),
      counted: receiptFigures(m.counted),
    },
  };
}

function receiptFigures(f: UsageReceiptTypedData["message"]["claimed"]): UsageReceiptFigures {
  return {
    $typeName: "gateway.v1.UsageReceiptFigures",
    present: f.present,
    inputTokens: BigInt(f.inputTokens),
    outputTokens: BigInt(f.outputTokens),
    cachedTokens: BigInt(f.cachedTokens),
    reasoningTokens: BigInt(f.reasoningTokens),
  };
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
 * The chat call of a StreamChatCompletion request's fields, for `caller`: one mapping for both
 * transports (the RPC's handler and the REST facade's direct chat call).
 */
export function chatInputOf(
  caller: Caller,
  req: {
    readonly body: Uint8Array;
    readonly permitId: string;
    readonly quoteId: string;
    readonly idempotencyKey: string;
    readonly dialect: Dialect;
  },
  signal: AbortSignal,
  headers: ChatInput["headers"],
): ChatInput {
  return {
    apiKeyId: caller.apiKeyId,
    authority: caller.authority,
    body: req.body,
    permitId: req.permitId === "" ? undefined : req.permitId,
    quoteId: req.quoteId === "" ? undefined : req.quoteId,
    idempotencyKey: req.idempotencyKey === "" ? undefined : req.idempotencyKey,
    signal,
    dialect: dialectName(req.dialect),
    headers,
  };
}

const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export function createInferenceService(
  deps: InferenceServiceDeps,
): ServiceImpl<typeof InferenceService> {
  return {
    async *streamChatCompletion(req, ctx) {
      const stream = deps.inference.chat(
        chatInputOf(callerOf(ctx), req, ctx.signal, ctx.requestHeader),
      );
      for await (const event of stream) {
        if (event.type !== "failed") yield eventToMessage(event);
      }
    },

    async getRequest(req, ctx) {
      if (!isHex32(req.id)) throw new GatewayError("invalid_hex", "request id must be a Hex32");
      const id = normalizeHex(req.id);
      // Read your writes: an answer this process just gave may still be recording its charge.
      await deps.inference.whenRecorded(id);
      const record = await deps.findRequest(id, apiKeyOf(ctx));
      if (record === undefined)
        throw new GatewayError("request_not_found", `request ${req.id} does not exist`);
      return create(GetRequestResponseSchema, { request: requestMessage(record) });
    },

    async getRequestReceipt(req, ctx) {
      const { deps: receipts, signer } = receiptSigner(deps.receipts);
      if (!isHex32(req.id)) throw new GatewayError("invalid_hex", "request id must be a Hex32");
      const id = normalizeHex(req.id);
      await deps.inference.whenRecorded(id);
      // The record's rule: only the key that made the request, and another key's looks absent.
      const record = await deps.findRequest(id, apiKeyOf(ctx));
      if (record === undefined)
        throw new GatewayError("request_not_found", `request ${req.id} does not exist`);
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
      let permit: Permit | undefined;
      try {
        permit = await deps.permits.get(permitId);
      } catch (err) {
        if (err instanceof GatewayError) throw err;
        throw new GatewayError("chain_unavailable", "the permit could not be read from the chain", {
          cause: err,
        });
      }
      if (permit === undefined)
        throw new GatewayError("permit_not_found", `permit ${permitId} does not exist`);
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
      return create(GetPermitResponseSchema, {
        permit: {
          permitId: balance.permitId,
          state: permitStateToProto[balance.state],
          modelId: balance.modelId,
          offerId: balance.offerId ?? "",
          payer: balance.payer,
          expiresAt: BigInt(balance.expiresAt),
          closableAt: balance.closableAt === undefined ? undefined : BigInt(balance.closableAt),
          deposit: balance.deposit.toString(),
          settled: balance.settled.toString(),
          chargedUnsettled: balance.chargedUnsettled.toString(),
          reserved: balance.reserved.toString(),
          available: balance.available.toString(),
        },
      });
    },
  };
}
