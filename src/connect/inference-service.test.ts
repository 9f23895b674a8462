import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Billing, StreamChatCompletionResponseSchema } from "../../gen/gateway/v1/inference_pb.js";
import type { Metering } from "../domain/chat/index.js";
import { eventToMessage } from "./inference-service.js";

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
