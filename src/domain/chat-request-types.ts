/** The chat request as the gateway reads it (chat-request.ts parses it). */
import type { Hex } from "viem";
import type { chatRoles } from "../schema/chat.js";
import type { JsonValue } from "./catalog.js";
import type { ProviderPreferences } from "./provider-preferences.js";

export type ChatRole = (typeof chatRoles)[number];

export type JsonObject = { readonly [key: string]: JsonValue };

/** One message; extra properties (name, tool_calls, tool_call_id...) are kept as sent. */
export interface ChatMessage {
  readonly role: ChatRole;
  readonly content: JsonValue;
  readonly [key: string]: JsonValue;
}

export interface ChatRequest {
  /** The body exactly as received. */
  readonly raw: Uint8Array;
  /** The parsed body, unknown properties included. */
  readonly body: JsonObject;
  readonly model: string;
  readonly messages: readonly ChatMessage[];
  /** The offer the request pins (`offer`), in lower case. */
  readonly offer?: Hex | undefined;
  /** Provider preferences (`provider`, OpenRouter's object; provider-preferences.ts). */
  readonly provider?: ProviderPreferences | undefined;
  readonly stream: boolean;
  /** The client asked for usage on its stream (`stream_options.include_usage === true`). */
  readonly includeUsage: boolean;
  readonly maxTokens?: bigint | undefined;
  readonly maxCompletionTokens?: bigint | undefined;
  /**
   * How many answers (`n`, OpenAI's "how many chat completion choices to generate") the
   * provider is asked for: 1 to {@link maxChoices}, 1 when absent or null. Each choice may use
   * the whole output limit, so it multiplies the output bound a quote prices.
   */
  readonly choices: bigint;
  readonly tools?: readonly JsonValue[] | undefined;
  readonly toolChoice?: JsonValue | undefined;
  readonly responseFormat?: JsonValue | undefined;
}
