/**
 * Per model (GET /v1/models), its offers side by side (GET /v1/models/{id}/offers): the price per
 * million tokens in the model's token units, the median time to first token and output speed,
 * the reputation score, how its tokens are metered, a cooldown after a 429 or 503, and flags
 * (requests flagged, usage claims above the gateway's count). Cheapest and fastest are marked in
 * words, not only by position.
 */
import { segment } from "../api.js";
import { badge, credits, h, table, time } from "../dom.js";
import { auditText } from "../audit-text.js";
import { mountKeyedPanel } from "../keyed-panel.js";
import { tokenUnits } from "../units.js";
import { short } from "./permits.js";

/** @type {import("../app.js").Panel} */
export const comparePanel = {
  id: "compare",
  title: "Offers compared",
  mount(section, context) {
    mountKeyedPanel(section, context, {
      className: "compare",
      hint: "Every offer of each model, side by side. Speed and score are medians over the reputation window; an offer in cooldown asked for a pause (429 or 503) and is not routed to until it ends.",
      refresh: "Refresh offers",
      noKey: "Enter an API key to compare the offers.",
      loading: "Loading offers…",
      read: async () => {
        const [gateway, models] = await Promise.all([
          context.api.get("/v1/gateway"),
          context.api.get("/v1/models").then((list) => list.data),
        ]);
        const offers = await Promise.all(
          models.map((m) => context.api.get(`/v1/models/${segment(m.id)}/offers`)),
        );
        return { models, offers, corpus: gateway.audit_corpus };
      },
      show: ({ models, offers, corpus }) => ({
        nodes: models.map((m, i) => modelComparison(m, offers[i].data, corpus)),
      }),
    });
  },
};

/**
 * @param {Record<string, any>} model
 * @param {Record<string, any>[]} offers
 * @param {string | null | undefined} corpus `GET /v1/gateway`'s `audit_corpus`
 */
function modelComparison(model, offers, corpus) {
  const units = tokenUnits(model);
  const price = (o) =>
    o.tariff === null || o.tariff === undefined
      ? undefined
      : BigInt(o.tariff.input_price_per_mtok) + BigInt(o.tariff.output_price_per_mtok);
  const prices = offers.map(price).filter((p) => p !== undefined);
  // Marked only when it differs: among equal prices none is "the cheapest".
  const cheapest = new Set(prices).size > 1 ? prices.reduce((a, b) => (b < a ? b : a)) : undefined;
  const speeds = offers
    .map((o) => o.reputation?.output_tokens_per_second)
    .filter((v) => typeof v === "number");
  const fastest = speeds.length === 0 ? undefined : Math.max(...speeds);
  return h(
    "article",
    { class: "card", "data-compare-model": model.id },
    h("h3", {}, model.id),
    offers.length === 0
      ? h("p", { class: "muted" }, "No offer serves this model.")
      : table(
          `Offers of ${model.id}: prices in ${units.symbol ?? "base units"} per million tokens`,
          [
            "Offer",
            "Status",
            "Input price",
            "Output price",
            "Time to first token",
            "Output speed",
            "Reputation score",
            "Metering",
            "Cooldown",
            "Flags",
            "Audits",
          ],
          offers.map((o) => {
            const r = o.reputation ?? {};
            const notes = [
              cheapest !== undefined && price(o) === cheapest && offers.length > 1
                ? "cheapest"
                : "",
              fastest !== undefined && r.output_tokens_per_second === fastest && speeds.length > 1
                ? "fastest"
                : "",
            ].filter((n) => n !== "");
            return [
              h(
                "span",
                {},
                h("code", { class: "hex short", title: o.offer_id }, short(o.offer_id)),
                notes.length === 0 ? null : h("span", { class: "note" }, ` ${notes.join(", ")}`),
              ),
              badge(o.status),
              o.tariff ? credits(o.tariff.input_price_per_mtok, units) : "no tariff",
              o.tariff ? credits(o.tariff.output_price_per_mtok, units) : "no tariff",
              typeof r.time_to_first_token_ms === "number"
                ? `${r.time_to_first_token_ms} ms`
                : "no data",
              typeof r.output_tokens_per_second === "number"
                ? `${r.output_tokens_per_second} tokens/s`
                : "no data",
              typeof r.score === "number" ? `${r.score} of 10000` : "no score yet",
              meteringText(o),
              cooldownText(o.cooldown_until),
              flagsText(o),
              auditText(o.audit, corpus),
            ];
          }),
          offers.map((o) => ({ "data-compare-offer": o.offer_id })),
        ),
  );
}

/**
 * Exact: the gateway counts with the model's tokenizer; bound: no tokenizer is registered, the
 * counts are upper bounds from the bytes.
 * @param {Record<string, any>} o
 */
function meteringText(o) {
  if (o.metering === "exact") return `exact tokenizer (${o.tokenizer})`;
  if (o.metering === "bound") return "upper bound (no tokenizer)";
  return "unknown";
}

/** @param {number | null | undefined} until Unix seconds */
function cooldownText(until) {
  if (typeof until !== "number" || until * 1000 <= Date.now()) return "none";
  return h("span", {}, "until ", time(until));
}

/** @param {Record<string, any>} o */
function flagsText(o) {
  const parts = [];
  const flags = o.reputation?.flags;
  if (typeof flags === "number" && flags > 0)
    parts.push(`${flags} flagged request${flags === 1 ? "" : "s"}`);
  if (o.usage_divergence?.excluded) parts.push("excluded: usage claims above the count");
  else if (o.usage_divergence?.flagged) parts.push("usage claims above the count");
  return parts.length === 0 ? "none" : parts.join("; ");
}
