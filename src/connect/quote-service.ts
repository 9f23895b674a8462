import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { CreateQuoteResponseSchema, QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { Inference } from "../domain/chat/index.js";
import { callerKey } from "./context.js";
import type { AuditStandings } from "../domain/audits/standing.js";
import { auditToMessage, meteringToMessage } from "./convert.js";
import { dialectName } from "./inference-messages.js";

/** Quotes, each with the quoted offer's audit standing (`audits`, from memory). */
export function createQuoteService(
  inference: Inference,
  audits?: Pick<AuditStandings, "get">,
): ServiceImpl<typeof QuoteService> {
  return {
    async createQuote(req, ctx) {
      const caller = ctx.values.get(callerKey);
      if (caller === undefined) throw new GatewayError("missing_api_key", "missing API key");
      const quote = await inference.createQuote({
        apiKeyId: caller.apiKeyId,
        body: req.body,
        dialect: dialectName(req.dialect),
      });
      return create(CreateQuoteResponseSchema, {
        quote: {
          quoteId: quote.quoteId,
          model: quote.model,
          modelId: quote.modelId,
          offerId: quote.offerId,
          tariffVersion: quote.tariffVersion.toString(),
          inputTokens: quote.inputTokens.toString(),
          maxOutputTokens: quote.maxOutputTokens.toString(),
          wakesEndpoint: quote.wakesEndpoint,
          maximumCredits: quote.maximumCredits.toString(),
          expiresAt: BigInt(quote.expiresAt),
          ...meteringToMessage(quote.metering),
          audit: auditToMessage(audits?.get(quote.offerId)),
        },
      });
    },
  };
}
