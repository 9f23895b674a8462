/**
 * The catalog: models (GET /v1/models) and, on demand, each model's offers
 * (GET /v1/models/{id}/offers) with their tariff, status, verification, health
 * (GET /v1/provider-offers/{id}/health) and reputation, with a chart comparing the offers'
 * latency and throughput.
 */
import { segment } from "../api.js";
import { badge, code, credits, facts, h, messageLine, time } from "../dom.js";
import { tokenUnits } from "../units.js";
import { divergenceView, reputationChart, reputationView } from "./reputation.js";

/** @type {import("../app.js").Panel} */
export const catalogPanel = {
  id: "catalog",
  title: "Catalog",
  mount(section, { api, events }) {
    const message = messageLine();
    const reload = h("button", { type: "button" }, "Reload catalog");
    const list = h("div", { class: "models" });
    section.append(h("div", { class: "buttons" }, reload), message.element, list);

    async function load() {
      list.replaceChildren();
      if (!api.hasKey()) {
        message.info("Enter an API key to see the catalog.");
        return;
      }
      message.info("Loading models…");
      try {
        const models = await api.get("/v1/models");
        message.info(`${models.data.length} model${models.data.length === 1 ? "" : "s"}.`);
        models.data.forEach((model, index) => list.append(modelView(model, index, api)));
      } catch (error) {
        message.error(error);
      }
    }

    reload.addEventListener("click", load);
    events.addEventListener("key", load);
    message.info("Enter an API key to see the catalog.");
  },
};

/**
 * @param {Record<string, any>} model
 * @param {number} index
 * @param {import("../api.js").Api} api
 */
function modelView(model, index, api) {
  const offersId = `offers-${index}`;
  const toggle = h(
    "button",
    { type: "button", "aria-expanded": "false", "aria-controls": offersId },
    `Offers of ${model.id}`,
  );
  const offers = h("div", { id: offersId, class: "offers", hidden: true });
  const message = messageLine();
  let loaded = false;

  toggle.addEventListener("click", async () => {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", String(open));
    offers.hidden = !open;
    if (!open || loaded) return;
    loaded = true;
    message.info("Loading offers…");
    try {
      const answer = await api.get(`/v1/models/${segment(model.id)}/offers`);
      message.info(`${answer.data.length} offer${answer.data.length === 1 ? "" : "s"}.`);
      if (answer.data.length > 0) offers.append(reputationChart(answer.data));
      for (const offer of answer.data) offers.append(offerView(offer, api, tokenUnits(model)));
    } catch (error) {
      loaded = false;
      message.error(error);
    }
  });

  return h(
    "article",
    { class: "model card", "data-model": model.id },
    h("h3", {}, model.id),
    facts([
      ["Status", badge(model.status)],
      ["Repository", `${model.repository}@${model.revision}`],
      ["Task", model.task],
      ["Aliases", model.aliases.length === 0 ? "none" : model.aliases.join(", ")],
      ["Providers", String(model.provider_count)],
      ["Metering", meteringText(model)],
      ["Model id", code(model.model_id)],
      ["Credit token", code(model.credit_token)],
    ]),
    h("div", { class: "buttons" }, toggle),
    message.element,
    offers,
  );
}

/**
 * How the gateway counts a model's or offer's tokens: its own tokenizer, or the byte bound
 * (charges above an exact count; `provider.require_exact_metering` refuses such offers).
 * @param {{ metering?: string | null, tokenizer?: string | null }} item
 */
function meteringText(item) {
  if (item.metering === "exact") return `exact (tokenizer ${item.tokenizer})`;
  if (item.metering === "bound") return "bound (no tokenizer registered: counts are upper bounds)";
  return "unknown";
}

/**
 * @param {Record<string, any>} offer
 * @param {import("../api.js").Api} api
 * @param {{ decimals?: number, symbol?: string }} units the model's credit token's
 */
function offerView(offer, api, units) {
  const health = h("div", { class: "health" }, h("h5", {}, "Health"));
  const healthMessage = messageLine();
  health.append(healthMessage.element);
  healthMessage.info("Checking…");
  api
    .get(`/v1/provider-offers/${segment(offer.offer_id)}/health`)
    .then((answer) => {
      healthMessage.clear();
      health.append(
        facts([
          ["Endpoint", answer.running ? "answering" : "not answering"],
          ["Checked", time(answer.checked_at)],
          ["Quarantine", answer.quarantine_reason ?? "none"],
        ]),
      );
    })
    .catch((error) => healthMessage.error(error));

  const capabilities = Object.entries(offer.capabilities ?? {}).map(
    ([name, value]) => `${name}: ${typeof value === "string" ? value : JSON.stringify(value)}`,
  );
  const tariff = offer.tariff;
  return h(
    "article",
    { class: "offer card", "data-offer-id": offer.offer_id },
    h("h4", {}, "Offer ", code(offer.offer_id)),
    facts([
      ["Status", badge(offer.status)],
      ["Region", offer.region],
      ["Hardware", offer.hardware],
      ["Max concurrency", String(offer.max_concurrency)],
      ["Metering", meteringText(offer)],
      ["Operator", code(offer.operator)],
      ["Capabilities", capabilities.length === 0 ? "none" : capabilities.join("; ")],
    ]),
    h("h5", {}, "Tariff"),
    tariff === undefined || tariff === null
      ? h("p", { class: "muted" }, "No tariff.")
      : facts([
          ["Input, per million tokens", credits(tariff.input_price_per_mtok, units)],
          ["Output, per million tokens", credits(tariff.output_price_per_mtok, units)],
          ["Wake fee", credits(tariff.wake_fee, units)],
          ["Version", tariff.version],
        ]),
    h("h5", {}, "Verification"),
    facts([
      ["Verified", time(offer.verified_at)],
      ["Expires", time(offer.verification_expires_at)],
      [
        "Proven features",
        offer.verified_features.length === 0 ? "none" : offer.verified_features.join(", "),
      ],
    ]),
    health,
    reputationView(offer.reputation),
    divergenceView(offer.usage_divergence),
  );
}
