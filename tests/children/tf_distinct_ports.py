"""runners.tf.devices.distinct_ports on each cluster of the JSON object in argv[1]. Prints one
line "RESULT <json>"."""

import json
import sys

from runners.tf.devices import distinct_ports

out = {}
for name, cluster in json.loads(sys.argv[1]).items():
    out[name] = distinct_ports(cluster, 5000)
print("RESULT " + json.dumps(out))
