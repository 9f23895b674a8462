import type { ServiceImpl } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import {
  CatalogService,
  GetModelResponseSchema,
  ListModelsResponseSchema,
  ListOffersResponseSchema,
} from "../../gen/gateway/v1/catalog_pb.js";
import type { Catalog } from "../domain/catalog.js";
import {
  modelStatusFromProto,
  modelToMessage,
  offerStatusFromProto,
  offerToMessage,
} from "./convert.js";

export function createCatalogService(catalog: Catalog): ServiceImpl<typeof CatalogService> {
  return {
    async listModels(req) {
      const models = await catalog.listModels(modelStatusFromProto(req.status));
      return create(ListModelsResponseSchema, {
        models: models.map((m) => modelToMessage(m, catalog.directory)),
      });
    },
    async getModel(req) {
      const model = await catalog.getModel(req.id);
      const offers = await catalog.listOffers(model.modelId);
      return create(GetModelResponseSchema, {
        model: modelToMessage(model, catalog.directory),
        offers: offers.map(offerToMessage),
      });
    },
    async listOffers(req) {
      const offers = await catalog.listOffers(req.model, offerStatusFromProto(req.status));
      return create(ListOffersResponseSchema, { offers: offers.map(offerToMessage) });
    },
  };
}
