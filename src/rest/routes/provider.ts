import { ProviderService } from "../../../gen/gateway/v1/provider_pb.js";
import { Hex32 } from "../../schema/common.js";
import {
  OfferEnvelope,
  OfferKeyBindingEnvelope,
  OfferKeyBindingList,
  VerifiedOffer,
  offerEarningsResource,
  offerHealthResource,
  offerKeyBindingResource,
  offerResource,
  verificationRunResource,
} from "../views/resources.js";
import {
  BindKeyRequest,
  BindOfferKeyTypedData,
  ChallengeRequest,
  KeyBindingChallengeRequest,
  RegisterRequest,
  RegistrationTypedData,
} from "../../schema/signing.js";
import type { Parameter } from "../route-spec.js";
import { integerQuery, seconds, typedDataAnswer, withBody, type Route } from "../route-kit.js";
import { bindOfferKeyTypedDataView, typedDataView } from "../views/challenges.js";

/** The ProviderService routes: an offer's endpoint, health, verification, key bindings, earnings. */

const secondsParameter = (name: string, description: string): Parameter => ({
  name,
  in: "query",
  required: false,
  description,
  schema: { type: "integer", minimum: 0, maximum: 999_999_999_999_999 },
});

const offerIdParameter = { description: "offer id", schema: Hex32 };

export const providerRoutes: readonly Route[] = [
  withBody(ChallengeRequest, {
    method: "POST",
    path: "/v1/provider-offers/challenge",
    operationId: "createRegistrationChallenge",
    summary: "EIP-712 typed data for the offer's operator to sign",
    tag: "provider",
    answer: typedDataAnswer(RegistrationTypedData),
    errors: {
      400: ["invalid_hex", "challenge_expiry_invalid"],
      404: ["offer_not_found"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, body }) => {
      const { typedData } = await unary(ProviderService.method.createRegistrationChallenge, {
        offerId: body.offerId,
        endpointUrl: body.endpointUrl,
        nonce: body.nonce ?? "",
        expiresAt: seconds(body.expiresAt),
        endpointToken: body.endpointToken ?? "",
      });
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: typedDataView(typedData) };
    },
  }),
  withBody(RegisterRequest, {
    method: "POST",
    path: "/v1/provider-offers/register",
    operationId: "registerEndpoint",
    summary: "Register the offer's private endpoint with the signed challenge",
    description: "The nonce is consumed atomically; the endpoint URL and token are never returned.",
    tag: "provider",
    answer: { description: "The offer", schema: OfferEnvelope },
    errors: {
      400: ["invalid_hex", "challenge_expiry_invalid", "endpoint_not_allowed"],
      401: ["invalid_signature"],
      403: ["not_offer_operator"],
      404: ["offer_not_found"],
      409: ["nonce_used"],
      503: ["chain_unavailable", "upstream_unavailable"],
    },
    handle: async ({ unary, body }) => {
      const { offer } = await unary(ProviderService.method.registerEndpoint, {
        offerId: body.offerId,
        endpointUrl: body.endpointUrl,
        nonce: body.nonce,
        expiresAt: BigInt(body.expiresAt),
        signature: body.signature,
        endpointToken: body.endpointToken ?? "",
      });
      if (offer === undefined) throw new Error("registration answered without an offer");
      return { body: { offer: offerResource.view(offer) } };
    },
  }),
  {
    method: "GET",
    path: "/v1/provider-offers/{id}/health",
    operationId: "getOfferHealth",
    summary: "An offer's health",
    tag: "provider",
    pathId: { description: "offer id", schema: Hex32 },
    answer: { description: "The health", schema: offerHealthResource.schema },
    errors: {
      400: ["invalid_hex"],
      404: ["offer_not_found"],
      503: ["chain_unavailable", "upstream_unavailable"],
    },
    handle: async ({ unary, params }) => {
      const { health } = await unary(ProviderService.method.getOfferHealth, { offerId: params[0] });
      if (health === undefined) throw new Error("health answered without a health record");
      return { body: offerHealthResource.view(health) };
    },
  },
  {
    method: "POST",
    path: "/v1/provider-offers/{id}/verify",
    operationId: "verifyOffer",
    summary: "Refresh the offer's verification (no body)",
    description:
      "Checks the endpoint: model listed, one-token completion, stream with usage, usage claims the gateway's own count of known prompts does not contradict (JSON and streamed; else 422 usage_diverged). Runs are shared per offer and at most one per `VERIFY_MIN_INTERVAL_SECONDS` across the fleet: inside that bound the last run's outcome is answered (`verification.replayed`; a failure's message says when it ran), and while the endpoint's first run is under way on another gateway, 429 `rate_limited`. A wrong answer names the check (422) and clears the verification; a run that gets no answer (timeout, refused connection, 429, 5xx) is 502 `endpoint_unreachable` and leaves a standing verification in place.",
    tag: "provider",
    pathId: { description: "offer id", schema: Hex32 },
    answer: { description: "The offer, verified", schema: VerifiedOffer },
    errors: {
      400: ["invalid_hex", "endpoint_not_allowed"],
      404: ["offer_not_found", "model_not_found"],
      422: [
        "model_not_listed",
        "completion_failed",
        "stream_failed",
        "usage_missing",
        "usage_diverged",
      ],
      502: ["endpoint_unreachable"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, params, req }) => {
      req.resume(); // the spec's verify takes no body
      const { offer, verification } = await unary(ProviderService.method.verifyOffer, {
        offerId: params[0],
      });
      if (offer === undefined) throw new Error("verify answered without an offer");
      return {
        body: {
          offer: offerResource.view(offer),
          ...(verification === undefined
            ? {}
            : { verification: verificationRunResource.view(verification) }),
        },
      };
    },
  },
  withBody(KeyBindingChallengeRequest, {
    method: "POST",
    path: "/v1/provider-offers/{id}/key-bindings/challenge",
    operationId: "createKeyBindingChallenge",
    summary:
      "EIP-712 BindOfferKey typed data for the offer's operator to sign for the calling API key",
    description:
      "The offer's operator as the chain names it now, the calling key's public id and a random single-use nonce are filled in. An empty body is `{}`.",
    tag: "provider",
    optional: true,
    pathId: offerIdParameter,
    answer: typedDataAnswer(BindOfferKeyTypedData),
    errors: { 400: ["invalid_hex"], 404: ["offer_not_found"], 503: ["chain_unavailable"] },
    handle: async ({ unary, params, body }) => {
      const { typedData } = await unary(ProviderService.method.createKeyBindingChallenge, {
        offerId: params[0],
        expiresAt: seconds(body.expiresAt),
      });
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: bindOfferKeyTypedDataView(typedData) };
    },
  }),
  withBody(BindKeyRequest, {
    method: "POST",
    path: "/v1/provider-offers/{id}/key-bindings",
    operationId: "bindKey",
    summary: "Store the operator's signed BindOfferKey for the calling API key",
    description:
      "Verified against the offer's operator as the chain names it now (ECDSA, or ERC-1271 for a contract operator); the nonce is consumed atomically. The key may then read the offer's earnings.",
    tag: "provider",
    pathId: offerIdParameter,
    answer: { description: "The binding", schema: OfferKeyBindingEnvelope },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature"],
      403: ["wrong_deployment"],
      404: ["offer_not_found"],
      409: ["nonce_used"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, params, body }) => {
      const { binding } = await unary(ProviderService.method.bindKey, {
        offerId: params[0],
        expiresAt: BigInt(body.expiresAt),
        nonce: body.nonce,
        signature: body.signature,
        ...(body.deployment === undefined ? {} : { deployment: body.deployment }),
      });
      if (binding === undefined) throw new Error("BindKey answered without a binding");
      return { body: { binding: offerKeyBindingResource.view(binding) } };
    },
  }),
  {
    method: "DELETE",
    path: "/v1/provider-offers/{id}/key-bindings/{bindingId}",
    operationId: "revokeKeyBinding",
    summary: "Revoke a key binding the calling API key holds on the offer",
    description:
      "Effective at once on every gateway sharing the database. Revoking again answers it unchanged.",
    tag: "provider",
    pathId: offerIdParameter,
    pathParams: [
      {
        name: "bindingId",
        in: "path",
        required: true,
        description: "binding id (`okb_...`)",
        schema: { type: "string" },
      },
    ],
    answer: { description: "The binding, revoked", schema: OfferKeyBindingEnvelope },
    errors: { 400: ["invalid_hex"], 404: ["binding_not_found"] },
    handle: async ({ unary, params, req }) => {
      req.resume(); // a DELETE takes no body
      const { binding } = await unary(ProviderService.method.revokeKeyBinding, {
        offerId: params[0],
        id: params[1],
      });
      if (binding === undefined) throw new Error("revocation answered without a binding");
      return { body: { binding: offerKeyBindingResource.view(binding) } };
    },
  },
  {
    method: "GET",
    path: "/v1/provider-offers/key-bindings",
    operationId: "listKeyBindings",
    summary: "The calling API key's active key bindings: the offers whose earnings it may read",
    description:
      "Every binding an offer's operator signed for the calling key that is neither revoked nor expired, newest first (the market console finds a provider's offers with it). A binding whose signer is no longer the offer's operator is listed, and its earnings read is refused (403 `not_offer_operator`).",
    tag: "provider",
    answer: { description: "The bindings", schema: OfferKeyBindingList },
    handle: async ({ unary }) => {
      const { bindings } = await unary(ProviderService.method.listKeyBindings, {});
      return {
        body: { object: "list", data: bindings.map((b) => offerKeyBindingResource.view(b)) },
      };
    },
  },
  {
    method: "GET",
    path: "/v1/provider-offers/{id}/earnings",
    operationId: "getOfferEarnings",
    summary:
      "An offer's earnings by settlement state (its operator's bound keys, or the settlement operator)",
    description:
      "Charges completed in [from, to) by settlement state (unsettled, settling, settled, unsettleable with the reasons), by UTC day of completion (`days`, oldest first: earnings over time), and the batches carrying them (newest first, at most 100). Only an API key the offer's current operator bound to the offer (POST .../key-bindings), or the settlement operator token; any other key is 403 `not_offer_operator`.",
    tag: "provider",
    auth: "apiKeyOrOperator",
    pathId: offerIdParameter,
    parameters: [
      secondsParameter("from", "Unix seconds, inclusive (default `to` less 30 days)"),
      secondsParameter(
        "to",
        "Unix seconds, exclusive (default now); the window spans at most 366 days (else 400 `invalid_request`)",
      ),
    ],
    answer: { description: "The earnings", schema: offerEarningsResource.schema },
    errors: {
      400: ["invalid_hex", "invalid_request"],
      403: ["not_offer_operator"],
      404: ["offer_not_found"],
    },
    handle: async ({ unary, params, query }) => {
      const from = integerQuery(query, "from");
      const to = integerQuery(query, "to");
      const { earnings } = await unary(ProviderService.method.getOfferEarnings, {
        offerId: params[0],
        ...(from === undefined ? {} : { from: BigInt(from) }),
        ...(to === undefined ? {} : { to: BigInt(to) }),
      });
      if (earnings === undefined) throw new Error("GetOfferEarnings answered without earnings");
      return { body: offerEarningsResource.view(earnings) };
    },
  },
];
