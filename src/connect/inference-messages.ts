import { create } from "@bufbuild/protobuf";
import {
  Billing,
  BudgetWarningSchema,
  ChatChunkSchema,
  ChatCompletedSchema,
  ChatStartedSchema,
  type ChatCompleted,
  Dialect,
  MeteringSchema,
  PermitState,
  RequestStatus,
  SettlementStatus,
  SignedUsageReceiptSchema,
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
import { budgetWarningText, type BudgetWarning } from "../domain/permit-authorization/index.js";
import type { RequestRecord } from "../domain/requests.js";
import type {
  ChatCompleted as DomainChatCompleted,
  ChatEvent,
  ChatInput,
  Metering,
  UsageFigures,
  UsageSource,
} from "../domain/chat/index.js";
import type { UsageReceiptTypedData } from "../domain/receipt-types.js";
import type { Caller } from "./context.js";

/**
 * The InferenceService's messages (inference-service.ts): a chat request's fields -> the chat
 * call, the chat's events -> stream messages, a request's record, receipt and permit state ->
 * theirs. Both transports use them: the RPC's handler, and the REST facade in process.
 */

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
    ...(event.receipt === undefined
      ? {}
      : {
          receipt: create(SignedUsageReceiptSchema, {
            receipt: receiptMessage(event.receipt.receipt),
            signature: event.receipt.signature,
            signer: event.receipt.signer,
          }),
        }),
    ...(event.budgetWarning === undefined
      ? {}
      : { budgetWarning: budgetWarningMessage(event.budgetWarning) }),
  };
}

/** A payer's soft threshold reached (issue 38), as ChatCompleted carries it. */
function budgetWarningMessage(w: BudgetWarning) {
  return create(BudgetWarningSchema, {
    code: "authorization_warn_threshold_reached",
    message: budgetWarningText(w),
    authorizationId: w.authorizationId,
    warnAt: w.warnAt.toString(),
    used: w.used.toString(),
    cap: w.cap.toString(),
    period: w.period,
    ...(w.renewsAt === undefined ? {} : { periodRenewsAt: BigInt(w.renewsAt) }),
  });
}

const statusToProto: Record<string, RequestStatus> = {
  pending: RequestStatus.PENDING,
  streaming: RequestStatus.STREAMING,
  completed: RequestStatus.COMPLETED,
  failed: RequestStatus.FAILED,
  cancelled: RequestStatus.CANCELLED,
};

export const permitStateToProto = {
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

export function settlementMessage(record: RequestRecord): Omit<RequestSettlement, "$typeName"> {
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

export function receiptMessage(
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

/** What a chat call asks besides its caller: the StreamChatCompletion request's fields. */
export interface ChatFields {
  readonly body: Uint8Array;
  readonly permitId: string;
  readonly quoteId: string;
  readonly idempotencyKey: string;
  readonly dialect: Dialect;
  /** Paid with x402 (the REST facade only; issue 37). */
  readonly x402?: ChatInput["x402"];
}

/**
 * The chat call of a StreamChatCompletion request's fields, for `caller`: one mapping for both
 * transports (the RPC's handler and the REST facade's direct chat call).
 */
export function chatInputOf(
  caller: Caller,
  req: ChatFields,
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
    ...(req.x402 === undefined ? {} : { x402: req.x402 }),
  };
}
