"""What a source is: `sources.yaml` read into typed specs (`specs`), the catalog the fleet loads
(`catalog`), and the YAML helpers both config files share (`yamlkit`).
"""
