/**
 * For a provider's key: the offers its operator bound it to (GET /v1/provider-offers/key-bindings)
 * and each one's earnings over the last 30 days (GET /v1/provider-offers/{id}/earnings, `days`):
 * a chart of the credits earned per UTC day, settled on chain or not yet, and a table of the same
 * numbers, in the offer's model's token units. No id to paste: the bindings name the offers.
 */
import { segment } from "../api.js";
import { code, credits, facts, h, messageLine, table } from "../dom.js";
import { dayChart, dayText } from "../day-chart.js";
import { modelUnits } from "../units.js";

const days = 30;
const daySeconds = 86400;
const settledSeries = "settled on chain";
const openSeries = "not yet settled";

/** @type {import("../app.js").Panel} */
export const offerEarningsPanel = {
  id: "offer-earnings",
  title: "Your offers' earnings",
  mount(section, { api, events }) {
    const message = messageLine();
    const reload = h("button", { type: "button" }, "Refresh earnings");
    const view = h("div", { class: "offer-earnings" });
    section.append(
      h(
        "p",
        { class: "hint" },
        `For a provider's key: the offers whose operator bound this key (gateway provider bind-key), and what each earned per UTC day over the last ${days} days.`,
      ),
      h("div", { class: "buttons" }, reload),
      message.element,
      view,
    );
    let generation = 0;

    async function load() {
      const mine = ++generation;
      view.replaceChildren();
      if (!api.hasKey()) {
        message.info("Enter an API key to see the earnings of the offers it is bound to.");
        return;
      }
      message.info("Loading…");
      try {
        const bindings = (await api.get("/v1/provider-offers/key-bindings")).data;
        const offers = [...new Set(bindings.map((b) => String(b.offer_id)))];
        const to = (Math.floor(Date.now() / 1000 / daySeconds) + 1) * daySeconds;
        const from = to - days * daySeconds;
        const cards = await Promise.all(offers.map((id) => offerCard(api, id, from, to)));
        if (mine !== generation) return;
        message.info(
          offers.length === 0
            ? "This key is bound to no offer (an offer's operator binds one with gateway provider bind-key)."
            : `${offers.length} offer${offers.length === 1 ? "" : "s"} bound to this key.`,
        );
        view.replaceChildren(...cards);
      } catch (error) {
        if (mine === generation) message.error(error);
      }
    }

    reload.addEventListener("click", load);
    events.addEventListener("key", load);
    events.addEventListener("ledger", load);
    message.info("Enter an API key to see the earnings of the offers it is bound to.");
  },
};

/**
 * One offer's earnings over time; an offer whose operator changed since the binding is refused
 * (403 `not_offer_operator`), and the card says so.
 * @param {import("../api.js").Api} api
 * @param {string} offerId
 * @param {number} from
 * @param {number} to
 */
async function offerCard(api, offerId, from, to) {
  const card = h(
    "article",
    { class: "card", "data-earnings-over-time": offerId },
    h("h3", {}, "Offer ", code(offerId)),
  );
  try {
    const e = await api.get(
      `/v1/provider-offers/${segment(offerId)}/earnings?from=${from}&to=${to}`,
    );
    const units = await modelUnits(api, e.model_id);
    const total = e.days.reduce((s, d) => s + BigInt(d.credits), 0n);
    const settled = e.days.reduce((s, d) => s + BigInt(d.settled_credits), 0n);
    const rows = e.days.flatMap((d) => [
      { day: Number(d.starts_at), series: settledSeries, credits: BigInt(d.settled_credits) },
      {
        day: Number(d.starts_at),
        series: openSeries,
        credits: BigInt(d.credits) - BigInt(d.settled_credits),
      },
    ]);
    const newest = [...e.days].reverse();
    card.append(
      facts([
        [`Earned, last ${days} days`, credits(total.toString(), units), "earned"],
        ["Of it settled on chain", credits(settled.toString(), units), "settled"],
        ["Payout address", code(e.payout)],
      ]),
      e.days.length === 0
        ? h("p", { class: "muted" }, `No charge in the last ${days} days.`)
        : dayChart({
            rows,
            series: [settledSeries, openSeries],
            from,
            days,
            units,
            title: `Earnings per day, in ${units.symbol ?? "base units"}`,
            name: "earnings-by-day",
          }),
      e.days.length === 0
        ? null
        : table(
            `Earnings by day, in ${units.symbol ?? "base units"} (newest first)`,
            ["Day (UTC)", "Requests", "Earned", "Of it settled"],
            newest.map((d) => [
              dayText(Number(d.starts_at)),
              String(d.requests),
              credits(d.credits, units),
              credits(d.settled_credits, units),
            ]),
            newest.map((d) => ({ "data-earnings-day": dayText(Number(d.starts_at)) })),
          ),
    );
  } catch (error) {
    const e = /** @type {{ code?: string, message?: string }} */ (error);
    card.append(h("p", { class: "status", "data-kind": "error" }, `${e.code}: ${e.message}`));
  }
  return card;
}
