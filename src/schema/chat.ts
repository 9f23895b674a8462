import { Type, type Static } from "@sinclair/typebox";
import { component, Hex32, OptionalNullable } from "./common.js";

/**
 * The chat completion request (spec: Chat request), declared once: validation
 * (src/domain/chat/request/request.ts), types and the OpenAPI document. TypeBox only: the answers
 * (OpenAI's chat.completion and its chunks), which carry `x_gateway`, the view of a protobuf
 * message, live with the transport that shows them (src/rest/views/chat.ts).
 */

/** The roles a message may have (OpenAI's, and the legacy `function`). */
export const chatRoles = ["system", "developer", "user", "assistant", "tool", "function"] as const;

/**
 * The largest `n`: OpenAI documents 128 as the most choices one chat completion may ask for. A
 * bound keeps the output bound (and so the reservation) of one request finite.
 */
export const maxChoiceCount = 128;

/** Most offer ids one provider preference list may name (a bound on the work routing does). */
export const maxPreferenceOffers = 64;

/** `provider.sort`'s orders (OpenRouter's names). */
export const providerSorts = ["price", "latency", "throughput"] as const;

export const ChatMessage = component(
  "ChatMessage",
  Type.Object(
    {
      role: Type.Unsafe<(typeof chatRoles)[number]>({ enum: [...chatRoles] }),
      content: Type.Unknown({
        description:
          "Required, any JSON value (null included): a string, or content parts as the model's API takes them.",
      }),
    },
    {
      additionalProperties: true,
      description:
        "One message. Its other members (name, tool_calls, tool_call_id, ...) are kept as sent.",
    },
  ),
);

/** Offer ids, at most {@link maxPreferenceOffers}. */
const offerList = (description: string) =>
  OptionalNullable(Type.Array(Hex32, { maxItems: maxPreferenceOffers }), { description });

/** A price per million tokens: credit base units as a decimal string (uint256: 78 digits). */
const PricePerMillion = Type.String({
  pattern: "^(0|[1-9][0-9]{0,77})$",
  title: "decimal string of credit base units per million tokens (at most 78 digits)",
});

export const ProviderPreferences = component(
  "ProviderPreferences",
  Type.Object(
    {
      order: offerList(
        "Offers tried first, in this order; the other eligible offers follow unless allow_fallbacks is false.",
      ),
      only: offerList("Route only to these offers."),
      ignore: offerList("Never route to these offers."),
      allow_fallbacks: OptionalNullable(Type.Boolean(), {
        default: true,
        description:
          "false: only the order list is tried (failing over within it); without order, only the first offer routing ranks.",
      }),
      sort: OptionalNullable(
        Type.Unsafe<(typeof providerSorts)[number]>({ enum: [...providerSorts] }),
        {
          description:
            "Replaces the default ranking: price (lowest maximum credits first), latency (lowest measured time to first token first), throughput (highest measured output tokens per second first); offers not measured yet come last.",
        },
      ),
      max_price: OptionalNullable(
        Type.Object(
          {
            prompt: OptionalNullable(PricePerMillion),
            completion: OptionalNullable(PricePerMillion),
          },
          { additionalProperties: false },
        ),
        {
          description:
            "Offers whose tariff is above either price are excluded (credit base units per million tokens), and offers whose maximum credits for the request, wake fee included, exceed the same request's maximum at these prices (a price left open counts at the offer's own). Holds also where the request's offer, its quote or its permit pins an offer. OpenRouter's other members (request, image) are refused.",
        },
      ),
      require_parameters: OptionalNullable(Type.Boolean(), {
        default: false,
        description:
          "Route only to offers whose verification proved every feature the request uses: tools, a response_format JSON schema, usage on a stream (see Offer.verified_features).",
      }),
      require_exact_metering: OptionalNullable(Type.Boolean(), {
        default: false,
        description:
          "Route only to offers the gateway meters exactly, with the model's own tokenizer (Offer.metering exact); an offer metered by the byte bound (no tokenizer registered for its model) is excluded, and a request only such offers could serve is refused 503 no_eligible_offer naming this member. Holds for a pinned request too.",
      }),
      require_audited: OptionalNullable(Type.Boolean(), {
        default: false,
        description:
          "Route only to offers whose audits pass (Offer.audit.state passing: audited, no evidence that the offer serves another model than the one it sells); unaudited, flagged and excluded offers are left out, and a request only such offers could serve is refused 503 no_eligible_offer naming this member. Holds for a pinned request too.",
      }),
    },
    {
      additionalProperties: false,
      description:
        "OpenRouter's provider routing object, applied to this market's offers (offer ids); null members are absent. The gateway's own member: it is not sent to the provider. Where the request's offer, its quote or its permit pins an offer, only max_price, require_exact_metering and require_audited apply: a pin wins over the rest. An invalid object, or an OpenRouter member this gateway does not support (data_collection, zdr, quantizations, ...), is refused 400 invalid_request naming the field; preferences that leave no eligible offer are refused 503 no_eligible_offer naming the preference.",
    },
  ),
);
export type ProviderPreferencesBody = Static<typeof ProviderPreferences>;

const outputLimit = (description: string) =>
  OptionalNullable(Type.Integer({ minimum: 1 }), { description });

/**
 * Servers' own output length controls, with the servers that read them: each can make a
 * provider generate other than what the quote priced (past its output limit, or on to it after
 * the model's end of text). A request
 * that sets one is refused (400 `invalid_request`, naming it): the gateway sends the priced limit
 * as `max_tokens` / `max_completion_tokens` instead (see `upstreamBody`). `null` (and `false`)
 * ask for nothing and are accepted, and cut from the body the provider receives.
 */
export const lengthControls = {
  n_predict: "llama.cpp",
  num_predict: "Ollama",
  min_tokens: "vLLM",
  ignore_eos: "vLLM, llama.cpp and SGLang",
  min_new_tokens: "SGLang and Hugging Face",
  max_new_tokens: "TGI, SGLang and Hugging Face",
  max_length: "Hugging Face and KoboldCpp",
  min_length: "Hugging Face",
} as const;

const lengthControl = (server: string) =>
  Type.Optional(
    Type.Union([Type.Null(), Type.Literal(false)], {
      "x-error-message": `is ${server}'s output length control, which would let the provider generate beyond the priced output limit: leave it out and set max_tokens or max_completion_tokens`,
      description: `${server}'s output length control: refused (400 invalid_request) unless absent, null or false; the priced limit goes to the provider as max_tokens or max_completion_tokens instead.`,
    }),
  );

const lengthControlMembers = Object.fromEntries(
  Object.entries(lengthControls).map(([name, server]) => [name, lengthControl(server)]),
) as { [K in keyof typeof lengthControls]: ReturnType<typeof lengthControl> };

/**
 * `stop`'s bounds: at most {@link maxStopStrings} strings (OpenAI's documented limit), each at
 * most {@link maxStopLength} characters. A provider counts the stop string it generates and the
 * client never sees it, so the gateway widens a stopped choice's output tolerance by the longest
 * one's tokens (`judgeUsage`'s `stopTokens`, src/domain/chat/usage.ts); bounded, that widening
 * stays small (64 characters are some 16 tokens of text, at most 256 of bytes).
 */
export const maxStopStrings = 4;
export const maxStopLength = 64;

const stopRefusal = `must be a string of at most ${maxStopLength} characters, or an array of at most ${maxStopStrings} such strings: a provider counts the stop string it generates, which the client never sees`;
const StopString = Type.String({ maxLength: maxStopLength, "x-error-message": stopRefusal });

/**
 * The members forwarded to the provider (docs/decisions/metering-and-tokens.md, "What reaches
 * the provider"): OpenAI's chat completion members that change nothing the gateway cannot see
 * or count, and three sampling members of the open-model servers (vLLM, SGLang, llama.cpp,
 * Ollama) that change only which tokens are drawn. Every other member of the body is cut from
 * what the provider receives (the gateway's own `offer` and `provider`, the servers' length
 * controls and extras accepted at their defaults, and members this gateway does not know), so a
 * member no one reviewed cannot make an honest provider generate or count what the client never
 * sees, and so be judged diverged. `chat_template_kwargs` and `reasoning_effort` reach the chat
 * template the gateway counts the prompt with, as they reach the provider's.
 */
export const forwardedMembers: readonly string[] = [
  "model",
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "n",
  "stream",
  "stream_options",
  "stop",
  "temperature",
  "top_p",
  "presence_penalty",
  "frequency_penalty",
  "logit_bias",
  "logprobs",
  "top_logprobs",
  "seed",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "response_format",
  "user",
  "reasoning_effort",
  "chat_template_kwargs",
  "top_k",
  "min_p",
  "repetition_penalty",
];

/**
 * Members a server reads that make the provider generate or count what the client never sees,
 * or count the prompt otherwise than the gateway's chat template does; each with the values that
 * change nothing (its default), which are accepted and cut (never forwarded). Any other value is
 * refused, 400 `invalid_request` naming the member.
 */
export const countingControls = {
  include_reasoning: {
    accepted: [null, true],
    why: "false has vLLM generate and count reasoning it does not return",
  },
  chat_template: {
    accepted: [null],
    why: "a template of the request's own renders a prompt other than the one the gateway counts",
  },
  documents: {
    accepted: [null],
    why: "documents are rendered into the prompt by the server's template, outside the messages the gateway counts",
  },
  mm_processor_kwargs: {
    accepted: [null],
    why: "it changes what the server counts for media",
  },
  add_special_tokens: {
    accepted: [null, false],
    why: "true adds tokens to the prompt that its chat template does not write",
  },
  add_generation_prompt: {
    accepted: [null, true],
    why: "false renders a prompt other than the one the gateway counts",
  },
  continue_final_message: {
    accepted: [null, false],
    why: "true renders a prompt other than the one the gateway counts",
  },
  echo: {
    accepted: [null, false],
    why: "true returns the prompt as the answer's output",
  },
  return_tokens_as_token_ids: {
    accepted: [null, false],
    why: "true returns token ids in place of the text",
  },
  functions: {
    accepted: [null],
    why: "the legacy functions are not counted with the prompt: use tools",
  },
  function_call: {
    accepted: [null],
    why: "the legacy function_call goes with functions: use tool_choice",
  },
} as const satisfies Record<string, { accepted: readonly (null | boolean)[]; why: string }>;

const countingControl = (name: string, accepted: readonly (null | boolean)[], why: string) =>
  Type.Optional(
    Type.Union(
      accepted.map((value) => (value === null ? Type.Null() : Type.Literal(value))),
      {
        "x-error-message": `is not forwarded to the provider: ${why}; leave it out${accepted.length > 1 ? ` (or ${accepted.filter((v) => v !== null).join(", ")})` : ""}`,
        description: `Never forwarded: ${why}. Refused (400 invalid_request) unless absent, ${accepted.map(String).join(" or ")}.`,
      },
    ),
  );

const countingControlMembers = Object.fromEntries(
  Object.entries(countingControls).map(([name, { accepted, why }]) => [
    name,
    countingControl(name, accepted, why),
  ]),
) as { [K in keyof typeof countingControls]: ReturnType<typeof countingControl> };

/**
 * Names `chat_template_kwargs` may not set: the variables the chat template is given by the
 * server itself (and by the gateway's counter), which a request's kwargs could otherwise replace.
 */
export const reservedTemplateKwargs: readonly string[] = [
  "messages",
  "tools",
  "documents",
  "add_generation_prompt",
  "continue_final_message",
  "chat_template",
  "add_special_tokens",
  "tokenize",
];

export const ChatRequest = component(
  "ChatRequest",
  Type.Object(
    {
      model: Type.String({ minLength: 1, description: "The catalog's public model id." }),
      messages: Type.Array(ChatMessage, { minItems: 1 }),
      offer: OptionalNullable(Hex32, {
        "x-error-code": "invalid_hex",
        description:
          "Pins the request to this offer (400 invalid_hex when not Hex32). A pin wins over provider preferences. The gateway's own member: it is not sent to the provider.",
      }),
      provider: OptionalNullable(ProviderPreferences),
      max_tokens: outputLimit(
        "The output limit of each choice, read exactly (also beyond 2^53); max_completion_tokens wins when both are given. Absent: the offer's max_output_tokens, else 4096. The provider receives the priced limit: max_tokens is added when neither is given, and one above the limit (or null) is set to it.",
      ),
      max_completion_tokens: outputLimit(
        "The output limit of each choice, read exactly (also beyond 2^53); wins over max_tokens.",
      ),
      n: OptionalNullable(Type.Integer({ minimum: 1, maximum: maxChoiceCount }), {
        default: 1,
        description:
          "How many choices to generate (null or absent: 1). Each may use the whole output limit, so the quote's max_output_tokens and maximum_credits, and the reservation, count the output limit n times; the quote binds n (another n is quote_mismatch).",
      }),
      best_of: OptionalNullable(Type.Integer(), {
        description:
          "Not a chat completions parameter: refused (400 invalid_request) unless absent, null or equal to n, since the provider would generate sequences no one pays for.",
      }),
      temperature: OptionalNullable(Type.Number()),
      top_p: OptionalNullable(Type.Number()),
      stop: OptionalNullable(
        Type.Union(
          [
            StopString,
            Type.Array(StopString, { maxItems: maxStopStrings, "x-error-message": stopRefusal }),
          ],
          { "x-error-message": stopRefusal },
        ),
        {
          "x-error-message": stopRefusal,
          description: `Up to ${maxStopStrings} strings of at most ${maxStopLength} characters each (400 invalid_request beyond). The provider counts the stop string it generates and the client never sees, so a stopped choice's output tolerance grows by the longest one's tokens.`,
        },
      ),
      stream: OptionalNullable(Type.Boolean(), {
        description:
          "true: the answer is a stream of chat.completion.chunk events, the last one carrying x_gateway, then [DONE].",
      }),
      stream_options: OptionalNullable(
        Type.Object(
          { include_usage: OptionalNullable(Type.Boolean()) },
          { additionalProperties: true },
        ),
        {
          description:
            "include_usage: true relays the provider's usage chunk to the client. The gateway always asks the provider for usage on a stream (it meters from it).",
        },
      ),
      tools: OptionalNullable(Type.Array(Type.Unknown())),
      tool_choice: Type.Optional(Type.Unknown()),
      response_format: Type.Optional(Type.Unknown()),
      seed: OptionalNullable(Type.Integer(), {
        description:
          "An integer literal (a fraction such as 1.5, or 1.00000000000000001, is refused); relayed as written, so a 64-bit seed keeps every digit.",
      }),
      user: OptionalNullable(Type.String()),
      chat_template_kwargs: OptionalNullable(Type.Object({}, { additionalProperties: true }), {
        description: `Variables for the model's chat template (vLLM's), forwarded; the gateway renders the prompt it counts with them too. They may not set the variables the server gives the template itself (${reservedTemplateKwargs.join(", ")}, or a name ending in _token): refused, 400 invalid_request.`,
      }),
      ...lengthControlMembers,
      ...countingControlMembers,
    },
    {
      additionalProperties: true,
      description:
        "OpenAI's chat completion request, with the gateway's offer and provider. An optional member set to null is absent; a member given twice is refused (400 invalid_request). Only OpenAI's chat completion members (and top_k, min_p, repetition_penalty, chat_template_kwargs) are relayed to the provider, as the client wrote them; every other member, unknown ones included, is cut. A server's own output length control (n_predict, min_tokens, ignore_eos...) and a member that would make the provider generate or count what the client never sees (include_reasoning: false, chat_template, documents, echo: true, ...) are refused. The quote binds model, messages, n, the output limit, tools, tool_choice and response_format.",
    },
  ),
);
export type ChatRequestBody = Static<typeof ChatRequest>;
