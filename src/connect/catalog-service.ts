import type { ServiceImpl } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import {
  CatalogService,
  GetModelResponseSchema,
  ListModelsResponseSchema,
  ListOffersResponseSchema,
} from "../../gen/gateway/v1/catalog_pb.js";
import type { Hex } from "viem";
import type { Catalog, ModelRecord, OfferRecord } from "../domain/catalog.js";
import type { Reputation } from "../domain/reputation/reputation.js";
import type { OfferCooldowns } from "../domain/reputation/cooldowns.js";
import type { AuditStandings } from "../domain/audits/standing.js";
import {
  auditToMessage,
  modelStatusFromProto,
  modelToMessage,
  offerStatusFromProto,
  offerToMessage,
} from "./convert.js";

/**
 * The catalog: models and offers, each offer with its reputation (`reputation`: from memory,
 * so listing offers costs no query beyond the catalog's own) and every model and offer with how
 * the gateway meters it (its model's tokenizer, or the byte bound; issue 35), and when an offer
 * cooling down after its provider's 429 is routed again (`cooldowns`, from memory too), and what
 * its audits say (`audits`, from memory: every offer, `unaudited` when never judged).
 */
export function createCatalogService(
  catalog: Catalog,
  reputation?: (offerId: Hex) => Reputation,
  cooldowns?: Pick<OfferCooldowns, "until">,
  audits?: Pick<AuditStandings, "get">,
): ServiceImpl<typeof CatalogService> {
  const shown = (model: ModelRecord) => (offer: OfferRecord) =>
    offerToMessage(
      offer,
      reputation?.(offer.offerId),
      model.metering,
      cooldowns?.until(offer.offerId),
      audits === undefined ? undefined : auditToMessage(audits.get(offer.offerId)),
    );
  return {
    async listModels(req) {
      const models = await catalog.listModels(modelStatusFromProto(req.status));
      return create(ListModelsResponseSchema, {
        models: models.map((m) => modelToMessage(m, catalog.directory)),
      });
    },
    async getModel(req) {
      const model = await catalog.getModel(req.id);
      const offers = await catalog.offersOf(model);
      return create(GetModelResponseSchema, {
        model: modelToMessage(model, catalog.directory),
        offers: offers.map(shown(model)),
      });
    },
    async listOffers(req) {
      const model = await catalog.getModel(req.model);
      const offers = await catalog.offersOf(model, offerStatusFromProto(req.status));
      return create(ListOffersResponseSchema, { offers: offers.map(shown(model)) });
    },
  };
}
