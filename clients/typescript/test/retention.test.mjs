import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentqClient, ApiError } from "../dist/index.js";
import { serverOnly } from "./helpers.mjs";

test("a retention rule is stored, listed, refused when bad and deleted", serverOnly, async () => {
  const aq = new AgentqClient();
  const tenant = `tskeeper${Date.now()}`;
  const rule = await aq.setTenantRetention(tenant, { days: 14, keep: "result" });
  assert.deepEqual([rule.kind, rule.name, rule.days, rule.keep, rule.source],
    ["tenant", tenant, 14, "result", "stored"]);
  try {
    const listed = await aq.retentionRules();
    assert.ok(listed.tenants.some((r) => r.name === tenant && r.days === 14));
    await assert.rejects(aq.setTenantRetention(tenant, { days: 0 }),
      (e) => e instanceof ApiError && e.status === 422 && e.field === "days");
    await assert.rejects(aq.setQueueRetention("default", { days: 3, keep: "all" }),
      (e) => e instanceof ApiError && e.status === 422 && e.field === "keep");
  } finally {
    await aq.deleteTenantRetention(tenant);
  }
  assert.ok(!(await aq.retentionRules()).tenants.some((r) => r.name === tenant));
  await assert.rejects(aq.deleteTenantRetention(tenant),
    (e) => e instanceof ApiError && e.status === 404);
});
