/* The compiled plan as a JSON object (schema: docs/check-json.md, "plan"). */
#ifndef TYCHO_PLAN_JSON_H
#define TYCHO_PLAN_JSON_H
#include "plan.h"
#include "util/strbuf.h"

void plan_json(const struct plan *p, struct json *j);

#endif
