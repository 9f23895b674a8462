import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { buildUsageReceipt, signableReceipt } from "../domain/receipts.js";
import {
  Billing,
  InferenceRequestSchema,
  StreamChatCompletionResponseSchema,
  UsageSource,
  type ChatCompleted as ChatCompletedMessage,
} from "../../gen/gateway/v1/inference_pb.js";
import type { RequestRecord } from "../domain/requests.js";
import type { ChatCompleted, Metering } from "../domain/chat/index.js";
import { chargeOf, chunkChargeOf } from "../domain/dialects/index.js";
import { xGatewayResource } from "../rest/views/chat.js";
import { requestResource } from "../rest/views/resources.js";
import { eventToMessage, requestMessage } from "./inference-messages.js";

const id = (n: number) => `0x${n.toString(16).padStart(64, "0")}` as const;

describe("eventToMessage", () => {
  it("writes the messages create() would make, byte for byte and in JSON", () => {
    const data = new TextEncoder().encode('{"choices":[]}');
    const cases = [
      {
        message: eventToMessage({
          type: "started",
          requestId: id(1),
          quoteId: id(2),
          offerId: id(3),
          tariffVersion: 4n,
          maximumCredits: 5000n,
          stream: true,
          replayed: false,
        }),
        expected: create(StreamChatCompletionResponseSchema, {
          event: {
            case: "started",
            value: {
              requestId: id(1),
              quoteId: id(2),
              offerId: id(3),
              tariffVersion: "4",
              maximumCredits: "5000",
              stream: true,
              replayed: false,
            },
          },
        }),
      },
      {
        message: eventToMessage({
          type: "chunk",
          data,
          metering: { inputTokens: 12n, outputTokens: 3n, credits: 77n },
        }),
        expected: create(StreamChatCompletionResponseSchema, {
          event: {
            case: "chunk",
            value: { data, metering: { inputTokens: 12n, outputTokens: 3n, credits: "77" } },
          },
        }),
      },
      {
        message: eventToMessage({
          type: "completed",
          requestId: id(1),
          quoteId: id(2),
          offerId: id(3),
          tariffVersion: 4n,
          inputTokens: 12n,
          outputTokens: 5n,
          creditsCharged: 90n,
          billing: "billed",
          usageFromProvider: true,
        }),
        expected: create(StreamChatCompletionResponseSchema, {
          event: {
            case: "completed",
            value: {
              requestId: id(1),
              quoteId: id(2),
              offerId: id(3),
              tariffVersion: "4",
              inputTokens: 12n,
              outputTokens: 5n,
              creditsCharged: "90",
              billing: Billing.BILLED,
              usageFromProvider: true,
              usageSource: UsageSource.PROVIDER,
            },
          },
        }),
      },
    ];
    for (const { message, expected } of cases) {
      expect(toBinary(StreamChatCompletionResponseSchema, message)).toEqual(
        toBinary(StreamChatCompletionResponseSchema, expected),
      );
      expect(toJson(StreamChatCompletionResponseSchema, message)).toEqual(
        toJson(StreamChatCompletionResponseSchema, expected),
      );
    }
  });

  it("prices a chunk's metering only when its credits are read", () => {
    let priced = 0;
    const metering: Metering = {
      inputTokens: 1n,
      outputTokens: 2n,
      get credits() {
        priced++;
        return 3n;
      },
    };
    const message = eventToMessage({ type: "chunk", data: new Uint8Array([1]), metering });
    expect(message.event.case === "chunk" && message.event.value.data).toEqual(new Uint8Array([1]));
    expect(priced).toBe(0);
    toBinary(StreamChatCompletionResponseSchema, message);
    expect(priced).toBe(1);
  });
});

const claimed = {
  inputTokens: 3_550n,
  outputTokens: 2_000n,
  cachedInputTokens: 7n,
  reasoningTokens: 1n,
};
const counted = { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n };

describe("both numbers: the provider's claim and the gateway's count", () => {
  const completed: ChatCompleted = {
    type: "completed",
    requestId: id(1),
    quoteId: id(2),
    offerId: id(3),
    tariffVersion: 4n,
    inputTokens: 12n,
    outputTokens: 5n,
    creditsCharged: 90n,
    billing: "billed",
    usageFromProvider: false,
    cachedInputTokens: 0n,
    reasoningTokens: 0n,
    claimed,
    counted,
  };

  it("the RPC's completed event carries both, and x_gateway shows both and whose was charged, in every dialect alike", () => {
    const message = eventToMessage(completed);
    const value = message.event.value as ChatCompletedMessage;
    expect(value.usageSource).toBe(UsageSource.GATEWAY);
    expect(toJson(StreamChatCompletionResponseSchema, message)).toMatchObject({
      completed: {
        usageClaimed: {
          inputTokens: "3550",
          outputTokens: "2000",
          cachedInputTokens: "7",
          reasoningTokens: "1",
        },
        usageCounted: { inputTokens: "12", outputTokens: "5" },
        usageSource: "USAGE_SOURCE_GATEWAY",
      },
    });
    const xGateway = xGatewayResource.view(value);
    expect(xGateway).toEqual({
      request_id: id(1),
      quote_id: id(2),
      offer_id: id(3),
      tariff_version: "4",
      input_tokens: "12",
      output_tokens: "5",
      credits_charged: "90",
      billing: "billed",
      cached_input_tokens: "0",
      reasoning_tokens: "0",
      usage_claimed: {
        input_tokens: "3550",
        output_tokens: "2000",
        cached_input_tokens: "7",
        reasoning_tokens: "1",
      },
      usage_counted: {
        input_tokens: "12",
        output_tokens: "5",
        cached_input_tokens: "0",
        reasoning_tokens: "0",
      },
      usage_source: "gateway",
    });
    // The Responses and Messages dialects write the same x_gateway; the chat stream's final
    // chunk too, its members in the order of the schema's view (the bytes it always had).
    expect(chargeOf(completed)).toEqual(xGateway);
    expect(JSON.stringify(chunkChargeOf(completed))).toBe(JSON.stringify(xGateway));

    // No claim (the provider reported no usage), nothing counted: null, not zeros.
    const bare: ChatCompleted = { ...completed, claimed: undefined, counted: undefined };
    const bareView = xGatewayResource.view(
      eventToMessage(bare).event.value as ChatCompletedMessage,
    );
    expect(bareView).toMatchObject({ usage_claimed: null, usage_counted: null });
    expect(chargeOf(bare)).toEqual(bareView);
    expect(chargeOf({ ...completed, usageFromProvider: true }).usage_source).toBe("provider");
  });

  it("a paid stream's receipt: the RPC's ChatCompleted.receipt is the x_gateway.receipt REST writes", async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    const typed = buildUsageReceipt(
      {
        id: id(1),
        permitId: id(9),
        offerId: id(3),
        modelId: id(8),
        tariffVersion: 4n,
        inputTokens: 12n,
        outputTokens: 5n,
        cachedInputTokens: 0n,
        reasoningTokens: 0n,
        creditsCharged: 90n,
        billing: "billed",
        status: "completed",
        completedAt: 1_790_000_000,
        usageSource: "gateway",
        claimed: null,
        counted: {
          inputTokens: 12n,
          outputTokens: 5n,
          cachedInputTokens: 0n,
          reasoningTokens: 0n,
        },
      },
      { chainId: 31337, market: `0x${"ab".repeat(20)}` },
    );
    const receipt = {
      receipt: typed,
      signature: await account.signTypedData(signableReceipt(typed)),
      signer: account.address,
    };
    const paid: ChatCompleted = { ...completed, receipt };
    const message = eventToMessage(paid).event.value as ChatCompletedMessage;
    expect(message.receipt?.signature).toBe(receipt.signature);
    const view = xGatewayResource.view(message);
    expect(view["receipt"]).toEqual(receipt);
    expect(chargeOf(paid)).toEqual(view);
    expect(JSON.stringify(chunkChargeOf(paid))).toBe(JSON.stringify(view));
    // Without one, the member is absent (not null): every other answer's bytes are unchanged.
    expect(
      "receipt" in xGatewayResource.view(eventToMessage(completed).event.value as object),
    ).toBe(false);
    expect("receipt" in chargeOf(completed)).toBe(false);
  });

  it("the request record shows both, over the RPC and REST; null when none", () => {
    const record: RequestRecord = {
      id: id(1),
      apiKeyId: "key_a",
      instanceId: "gw",
      model: "m",
      modelId: id(4),
      offerId: id(3),
      permitId: id(5),
      quoteId: id(2),
      stream: false,
      status: "completed",
      inputTokens: 12n,
      outputTokens: 5n,
      cachedInputTokens: 0n,
      reasoningTokens: 0n,
      maximumCredits: 1000n,
      creditsCharged: 90n,
      billing: "billed",
      usageSource: "gateway",
      claimed,
      counted,
      tariffVersion: 4n,
      error: null,
      createdAt: 1_700_000_000,
      completedAt: 1_700_000_005,
      settlementStatus: "unsettled",
      batchId: null,
      txHash: null,
      settledAt: null,
      settlementReason: null,
    };
    const message = requestMessage(record);
    expect(toJson(InferenceRequestSchema, message)).toMatchObject({
      usageClaimed: { inputTokens: "3550", outputTokens: "2000" },
      usageCounted: { inputTokens: "12", outputTokens: "5" },
      usageSource: "USAGE_SOURCE_GATEWAY",
    });
    expect(requestResource.view(message)).toMatchObject({
      object: "inference.request",
      input_tokens: "12",
      output_tokens: "5",
      usage_source: "gateway",
      usage_claimed: {
        input_tokens: "3550",
        output_tokens: "2000",
        cached_input_tokens: "7",
        reasoning_tokens: "1",
      },
      usage_counted: {
        input_tokens: "12",
        output_tokens: "5",
        cached_input_tokens: "0",
        reasoning_tokens: "0",
      },
    });
    const open = requestMessage({
      ...record,
      status: "pending",
      usageSource: null,
      claimed: null,
      counted: null,
    });
    expect(requestResource.view(open)).toMatchObject({
      usage_source: null,
      usage_claimed: null,
      usage_counted: null,
    });
  });
});
