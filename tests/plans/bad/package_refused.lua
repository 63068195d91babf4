-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: 'package' is not available in the plan sandbox
local tycho = require "tycho"
package.loadlib("libc.so.6", "system")  -- @error
return tycho.plan {}
