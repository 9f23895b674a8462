import { AuditService } from "../../../gen/gateway/v1/audit_pb.js";
import { AuditStandingList, auditStandingResource } from "../views/audits.js";
import type { Route } from "../route-kit.js";

/** The AuditService routes (the operator's): every offer's audit standing with its evidence. */
export const auditRoutes: readonly Route[] = [
  {
    method: "GET",
    path: "/audits/standings",
    operationId: "listAuditStandings",
    summary: "Every offer's audit standing with its evidence (operator)",
    description:
      "The offers the market's audits judged (docs/decisions/audits.md), by model then offer id: the state, e-value and thresholds, the reference, and per test the samples, statistic, p-value and e-value. Offers never judged are not listed (the catalog shows them unaudited). `model_id` keeps one model's offers.",
    tag: "audits",
    auth: "operator",
    parameters: [
      {
        name: "model_id",
        in: "query",
        required: false,
        description: "Only this model's offers (a Hex32 ModelID; else 400 `invalid_request`).",
        schema: { type: "string", pattern: "^0x[0-9a-fA-F]{64}$" },
      },
    ],
    answer: { description: "The standings", schema: AuditStandingList },
    errors: { 400: ["invalid_request"], 503: ["database_unavailable"] },
    handle: async ({ unary, query }) => {
      const modelId = query === "" ? null : new URLSearchParams(query).get("model_id");
      const { standings } = await unary(AuditService.method.listAuditStandings, {
        modelId: modelId ?? "",
      });
      return { body: { object: "list", data: standings.map(auditStandingResource.view) } };
    },
  },
];
