import { Type } from "@sinclair/typebox";
import { Dialect } from "../../../gen/gateway/v1/inference_pb.js";
import { QuoteService } from "../../../gen/gateway/v1/quote_pb.js";
import { GatewayError } from "../../domain/errors.js";
import { ChatRequest } from "../../schema/chat.js";
import { MessagesRequest } from "../../schema/messages.js";
import { quoteResource } from "../views/resources.js";
import { ResponsesRequest } from "../../schema/responses.js";
import { readJsonBytes } from "../body.js";
import type { Route } from "../route-kit.js";

/** The QuoteService route: a quote of a chat request, in any dialect. */

/** `?dialect=` of a quote: which dialect its body is written in. */
function quoteDialect(query: string): Dialect {
  const word = query === "" ? null : new URLSearchParams(query).get("dialect");
  switch (word) {
    case null:
    case "chat":
      return Dialect.UNSPECIFIED;
    case "responses":
      return Dialect.RESPONSES;
    case "messages":
      return Dialect.MESSAGES;
    default:
      throw new GatewayError("invalid_request", "'dialect' must be chat, responses or messages");
  }
}

export const quoteRoutes: readonly Route[] = [
  {
    method: "POST",
    path: "/v1/quotes",
    operationId: "createQuote",
    summary: "Quote the most a chat request can cost",
    description:
      "Bound to the request's model, messages, output limit, tools, tool choice and response format; single use; expires after 60 s. No permit needed. With `?dialect=responses` or `?dialect=messages` the body is a Responses or Messages request, and the quote binds the chat completion it translates to (DESIGN.md section 9).",
    tag: "inference",
    parameters: [
      {
        name: "dialect",
        in: "query",
        required: false,
        description: "The dialect of the body: `chat` (default), `responses` or `messages`",
        schema: { enum: ["chat", "responses", "messages"] },
      },
    ],
    body: { schema: Type.Union([ChatRequest, ResponsesRequest, MessagesRequest]) },
    answer: { description: "The quote", schema: quoteResource.schema },
    errors: {
      400: ["invalid_hex"],
      404: ["model_not_found"],
      503: ["no_eligible_offer", "offer_cooling_down", "offer_model_mismatch", "chain_unavailable"],
    },
    handle: async ({ unary, req, deps, query }) => {
      const dialect = quoteDialect(query);
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      const { quote } = await unary(QuoteService.method.createQuote, { body, dialect });
      if (quote === undefined) throw new Error("CreateQuote answered without a quote");
      return { body: quoteResource.view(quote) };
    },
  },
];
