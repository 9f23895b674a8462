import { CatalogService } from "../../../gen/gateway/v1/catalog_pb.js";
import { ModelStatusSchema, OfferStatusSchema } from "../../../gen/gateway/v1/market_pb.js";
import { enumWords } from "../views/proto-view.js";
import {
  ModelList,
  ModelWithOffers,
  OfferList,
  modelResource,
  offerResource,
} from "../views/resources.js";
import { statusFilter } from "../document.js";
import { statusOf, type Route } from "../route-kit.js";

/** The CatalogService routes: the models and their offers. */

export const catalogRoutes: readonly Route[] = [
  {
    method: "GET",
    path: "/v1/models",
    operationId: "listModels",
    summary: "List canonical models",
    tag: "catalog",
    parameters: [statusFilter(enumWords(ModelStatusSchema))],
    answer: { description: "The models", schema: ModelList },
    errors: { 400: ["invalid_request"] },
    handle: async ({ unary, query }) => {
      const { models } = await unary(CatalogService.method.listModels, {
        status: statusOf(ModelStatusSchema, query),
      });
      return { body: { object: "list", data: models.map(modelResource.view) } };
    },
  },
  {
    method: "GET",
    path: "/v1/models/{id}",
    operationId: "getModel",
    summary: "Get one model with its offers",
    tag: "catalog",
    pathId: { description: "the public model id, an alias, or the ModelID (Hex32)" },
    answer: { description: "The model", schema: ModelWithOffers },
    errors: { 404: ["model_not_found"] },
    handle: async ({ unary, params }) => {
      const { model, offers } = await unary(CatalogService.method.getModel, { id: params[0] });
      if (model === undefined) throw new Error("GetModel answered without a model");
      return { body: { ...modelResource.view(model), offers: offers.map(offerResource.view) } };
    },
  },
  {
    method: "GET",
    path: "/v1/models/{id}/offers",
    operationId: "listOffers",
    summary: "List the offers of a model",
    tag: "catalog",
    pathId: { description: "the public model id, an alias, or the ModelID (Hex32)" },
    parameters: [statusFilter(enumWords(OfferStatusSchema))],
    answer: { description: "The offers", schema: OfferList },
    errors: { 404: ["model_not_found"] },
    handle: async ({ unary, params, query }) => {
      const { offers } = await unary(CatalogService.method.listOffers, {
        model: params[0],
        status: statusOf(OfferStatusSchema, query),
      });
      return { body: { object: "list", data: offers.map(offerResource.view) } };
    },
  },
];
