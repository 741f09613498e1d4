import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentqClient, ApiError } from "../dist/index.js";
import { serverOnly } from "./helpers.mjs";

test("a schedule is created, triggered, paused, resumed and deleted", serverOnly, async () => {
  const aq = new AgentqClient();
  const s = await aq.createSchedule({ prompt: "ts tick" },
    { cron: "*/5 * * * *", timezone: "Asia/Tokyo", overlap: "allow_all" });
  try {
    assert.equal(s.timezone, "Asia/Tokyo");
    assert.deepEqual(s.session, { prompt: "ts tick" });
    assert.ok((await aq.listSchedules({ limit: 500 })).schedules.some((x) => x.id === s.id));
    assert.equal((await aq.pauseSchedule(s.id)).paused, true);
    const fire = await aq.triggerSchedule(s.id);
    assert.equal(fire.outcome, "started");
    assert.equal(fire.manual, true);
    const page = await aq.listScheduleFires(s.id);
    assert.deepEqual(page.fires.map((f) => f.session_id), [fire.session_id]);
    assert.equal((await aq.resumeSchedule(s.id)).paused, false);
    assert.equal((await aq.getSchedule(s.id)).last_session_id, fire.session_id);
  } finally {
    await aq.deleteSchedule(s.id);
  }
  await assert.rejects(aq.getSchedule(s.id), (e) => e instanceof ApiError && e.status === 404);
  await assert.rejects(aq.createSchedule({ prompt: "x" }, { every_secs: 0 }),
    (e) => e instanceof ApiError && e.status === 422 && e.field === "every_secs");
});
