"""A real schema registry for tests and demos: Apicurio Registry (SQL storage on H2, in memory or
in a file that survives a restart; optionally HTTPS and basic auth), serving the
Confluent-compatible API (``/apis/ccompat/v6``) that confluent-kafka's client speaks.

Maven Central has Apicurio's application module (``io.apicurio:apicurio-registry-app``) but no
runnable jar, so the test bed builds one: it writes a small Maven project into
``cache_dir("apicurio", <version>, "build")`` that depends on the application module and
packages it with the Quarkus Maven plugin, then keeps the runner jar and its ``lib/`` folder in
``cache_dir("apicurio", <version>, "app")``. Every registry after that is a plain
``java -jar <runner>.jar`` on a free loopback port. Nothing built is committed.

    python -m offtake_testbed.apicurio install        # build both (once), print the jars
    python -m offtake_testbed.apicurio run --port N   # foreground registry until Ctrl-C

A second build adds Quarkus' own properties-file security extension
(``io.quarkus:quarkus-elytron-security-properties-file``, Apicurio's Quarkus version) for a
registry that needs HTTP basic auth (``ApicurioRegistry(users=...)``); it leaves out Apicurio's
own authentication mechanism (OIDC bearer tokens, which it cannot use without Keycloak and
which, off, still fails every challenge). Both are cached side by side.

Why 2.4.2.Final: it is the newest release whose every dependency Maven Central serves (3.x
and 2.5+ need ``apicurio-registry-schema-util-provider`` versions that Central does not have).
Two of its dependencies are not on Central in the versions it names and are replaced by ones
that are (see :mod:`.install`); its own classes carry no Jandex index, so the build indexes
the application module explicitly (``quarkus.index-dependency``).

The modules: :mod:`.install` (the Maven build), :mod:`.registry` (the service), :mod:`.cli`.
"""

from .install import APICURIO_VERSION, ApicurioTestbedError, install_apicurio
from .registry import ApicurioRegistry, RegistryTls

__all__ = [
    "APICURIO_VERSION",
    "ApicurioRegistry",
    "ApicurioTestbedError",
    "RegistryTls",
    "install_apicurio",
]
