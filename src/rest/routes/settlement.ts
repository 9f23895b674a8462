import { Type } from "@sinclair/typebox";
import { BatchStatusSchema, SettlementService } from "../../../gen/gateway/v1/settlement_pb.js";
import { OptionalNullable } from "../../schema/common.js";
import { enumWords } from "../views/proto-view.js";
import { SettlementBatchList, batchRecordResource, flushResource } from "../views/resources.js";
import { statusFilter } from "../document.js";
import { integerQuery, statusOf, withBody, type Route } from "../route-kit.js";

/** The SettlementService routes (the settlement operator's): the batches, and a flush. */

const FlushRequest = Type.Object(
  {
    maxRequests: OptionalNullable(Type.Integer({ minimum: 1, maximum: 4294967295 })),
    max_requests: OptionalNullable(Type.Integer({ minimum: 1, maximum: 4294967295 })),
    dryRun: OptionalNullable(Type.Boolean()),
    dry_run: OptionalNullable(Type.Boolean()),
  },
  { description: "camelCase; snake_case (`max_requests`, `dry_run`) is accepted too" },
);

/** The batch states a stored batch can be in (a dry run is never stored). */
const storedBatchStates = enumWords(BatchStatusSchema).filter((w) => w !== "dry_run");

export const settlementRoutes: readonly Route[] = [
  {
    method: "GET",
    path: "/settlements/batches",
    operationId: "listSettlementBatches",
    summary: "The most recent settlement batches, newest first (settlement operator)",
    tag: "settlement",
    auth: "operator",
    parameters: [
      {
        name: "limit",
        in: "query",
        required: false,
        description: "At most this many (default 50, at most 500; else 400 `invalid_request`).",
        schema: { type: "integer", minimum: 1, maximum: 500 },
      },
      statusFilter(storedBatchStates),
    ],
    answer: { description: "The batches", schema: SettlementBatchList },
    errors: { 400: ["invalid_request"], 503: ["database_unavailable"] },
    handle: async ({ unary, query }) => {
      const limit = integerQuery(query, "limit");
      const { batches } = await unary(SettlementService.method.listBatches, {
        ...(limit === undefined ? {} : { limit: Math.min(limit, 4294967295) }),
        status: statusOf(BatchStatusSchema, query),
      });
      return { body: { object: "list", data: batches.map(batchRecordResource.view) } };
    },
  },
  withBody(FlushRequest, {
    method: "POST",
    path: "/settlements/flush",
    operationId: "flushSettlement",
    summary: "Settle unsettled charges on chain now (settlement worker)",
    description:
      "Safe to call concurrently (another flush in progress: `busy: true`) and after a crash. An empty body is `{}`.",
    tag: "settlement",
    auth: "operator",
    optional: true,
    answer: { description: "What the flush did", schema: flushResource.schema },
    errors: { 503: ["settlement_unavailable", "chain_unavailable", "database_unavailable"] },
    handle: async ({ unary, body }) => {
      const maxRequests = body.maxRequests ?? body.max_requests;
      const dryRun = body.dryRun ?? body.dry_run;
      const response = await unary(SettlementService.method.flush, {
        ...(maxRequests == null ? {} : { maxRequests }),
        dryRun: dryRun === true,
      });
      return { body: flushResource.view(response) };
    },
  }),
];
